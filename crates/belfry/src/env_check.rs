//! `BELFRY_*` variables in the environment that belfry does not read: a typo
//! (`BELFRY_HTTP_IDLE_TIMOUT`) would otherwise leave the setting at its default without a
//! word, where the same typo in the config file is refused. Warned about, not refused: other
//! tools of an installation may set variables under the same prefix.

use crate::auth_config::ADMIN_TOKEN_ENV;
use crate::config::{CONNECTION_ENV_PREFIX, ENV_OVERRIDES};
use crate::store_config::REDIS_ENV_OVERRIDES;

/// The other variables belfry reads (besides the settings' overrides): the server's flags,
/// the CLI's, and the test and bench tools'.
const OTHER_VARS: &[&str] = &[
    "BELFRY_CONFIG",
    "BELFRY_LISTEN",
    "BELFRY_DATA_DIR",
    "BELFRY_SERVER",
    "BELFRY_TOKEN",
    "BELFRY_CA_FILE",
    "BELFRY_BIN",
    "BELFRY_TOOLS",
    "BELFRY_CRASH_SEED",
    "BELFRY_WRITE_FIXTURE",
    "BELFRY_DEBUG_NATS",
];

/// Prefixes of variable families belfry reads.
const KNOWN_PREFIXES: &[&str] = &[CONNECTION_ENV_PREFIX, "BELFRY_SIM_"];

/// Every variable name belfry reads (prefixed families aside).
fn known() -> impl Iterator<Item = &'static str> {
    ENV_OVERRIDES
        .iter()
        .chain(REDIS_ENV_OVERRIDES)
        .map(|(var, _)| *var)
        .chain(OTHER_VARS.iter().copied())
        .chain([ADMIN_TOKEN_ENV])
}

/// A warning for each `BELFRY_*` name in `names` that belfry does not read, naming the
/// closest one it does when there is one near.
pub fn unknown_vars(names: impl IntoIterator<Item = String>) -> Vec<String> {
    names
        .into_iter()
        .filter(|name| name.starts_with("BELFRY_"))
        .filter(|name| !KNOWN_PREFIXES.iter().any(|p| name.starts_with(p)))
        .filter(|name| !known().any(|k| k == name))
        .map(|name| {
            let near = known()
                .map(|k| (strsim::levenshtein(k, &name), k))
                .min()
                .filter(|(distance, _)| *distance <= 3);
            match near {
                Some((_, k)) => format!("{name} is not a variable belfry reads (did you mean {k}?): it has no effect"),
                None => format!("{name} is not a variable belfry reads: it has no effect (the settings' variables are in docs/operations.md)"),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typos_are_named_with_the_nearest_variable() {
        let warned = unknown_vars(
            [
                "BELFRY_HTTP_IDLE_TIMOUT",
                "BELFRY_HTTP_IDLE_TIMEOUT",
                "BELFRY_CONNECTIONS__MAIN__URL",
                "BELFRY_SIM_SEED",
                "BELFRY_TOKEN",
                "BELFRY_REDIS_NAMESPACE",
                "BELFRY_SOMETHING_ELSE_ENTIRELY",
                "PATH",
            ]
            .map(String::from),
        );
        assert_eq!(warned.len(), 2, "{warned:?}");
        assert!(
            warned[0].contains("BELFRY_HTTP_IDLE_TIMOUT")
                && warned[0].contains("did you mean BELFRY_HTTP_IDLE_TIMEOUT?"),
            "{}",
            warned[0]
        );
        assert!(
            warned[1].starts_with("BELFRY_SOMETHING_ELSE_ENTIRELY") && !warned[1].contains("mean"),
            "{}",
            warned[1]
        );
    }
}
