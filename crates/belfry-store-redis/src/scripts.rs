//! The Lua scripts, each run atomically on the one slot its keys share. `lua/prelude.lua`
//! documents the keys and the record header every task script reads.

use std::sync::LazyLock;

/// A script's source and its SHA-1, as `EVALSHA` names it.
pub(crate) struct Lua {
    pub(crate) source: &'static str,
    pub(crate) sha: String,
}

impl Lua {
    fn new(source: &'static str) -> Lua {
        Lua {
            source,
            sha: redis::Script::new(source).get_hash().to_owned(),
        }
    }
}

macro_rules! task_script {
    ($name:ident, $file:literal) => {
        pub(crate) static $name: LazyLock<Lua> = LazyLock::new(|| {
            Lua::new(concat!(
                include_str!("lua/prelude.lua"),
                include_str!($file)
            ))
        });
    };
}

task_script!(PUT, "lua/put.lua");
task_script!(CLAIM, "lua/claim.lua");
task_script!(LEASE, "lua/lease.lua");
task_script!(CHANGE, "lua/change.lua");
task_script!(READ, "lua/read.lua");

pub(crate) static QUEUE: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("lua/queue.lua")));
pub(crate) static HINT: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("lua/hint.lua")));
pub(crate) static HINT_CLAIM: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("lua/hint_claim.lua")));
pub(crate) static RATE: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("lua/rate.lua")));
pub(crate) static INFLIGHT: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("lua/inflight.lua")));
/// Sent whole (`EVAL`) in lease pipelines: never `NOSCRIPT` (see the script).
pub(crate) const INFLIGHT_END: &str = include_str!("lua/inflight_end.lua");
pub(crate) static META: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("lua/meta.lua")));

/// Every script, to load them all on a node that lacks them.
pub(crate) fn all() -> [&'static Lua; 11] {
    [
        &PUT,
        &CLAIM,
        &LEASE,
        &CHANGE,
        &READ,
        &QUEUE,
        &HINT,
        &HINT_CLAIM,
        &RATE,
        &META,
        &INFLIGHT,
    ]
}
