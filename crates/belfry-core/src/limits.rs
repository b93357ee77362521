//! Named limits. Every bound the system enforces lives here or in validated config, with the
//! reason for its value.

/// Longest queue name. Names appear in file names, metric labels and Redis keys.
pub const QUEUE_NAME_LEN_MAX: usize = 128;

/// Default largest payload (1 MiB): large enough for any notification body, small enough that
/// a batch of them fits comfortably in memory while it is being committed.
pub const PAYLOAD_BYTES_MAX_DEFAULT: usize = 1024 * 1024;

/// Deepest nesting of arrays and objects in a JSON payload: the default recursion limit of
/// common JSON parsers (serde_json's), so every consumer can read what belfry accepts.
pub const PAYLOAD_NESTING_MAX: usize = 128;

/// Tasks in one batch submit request.
pub const BATCH_TASKS_MAX: usize = 1_000;

/// Tasks handed out by one lease call.
pub const LEASE_TASKS_MAX: usize = 1_000;

/// Longest long-poll a lease call may ask for (30 s), below common proxy idle timeouts.
pub const LEASE_WAIT_MS_MAX: u64 = 30_000;

/// Shortest and longest visibility timeout of a lease.
pub const LEASE_VISIBILITY_MS_MIN: u64 = 100;
pub const LEASE_VISIBILITY_MS_MAX: u64 = 12 * 60 * 60 * 1000;

/// Default visibility timeout when a consumer does not name one.
pub const LEASE_VISIBILITY_MS_DEFAULT: u64 = 30_000;

/// Default horizon: how far in the future a task may be due (10 years).
pub const HORIZON_MS_DEFAULT: u64 = 10 * 365 * 24 * 60 * 60 * 1000;

/// Headers on one task, and the size of each, so a task's metadata stays small next to its
/// payload.
pub const HEADERS_MAX: usize = 64;
pub const HEADER_NAME_LEN_MAX: usize = 256;
pub const HEADER_VALUE_LEN_MAX: usize = 4096;

/// Fixed headers a webhook queue adds to every request (`delivery.headers`): a credential
/// for an API gateway and a few markers. At most 32 of them and 8 KiB in all (names and
/// values), the size of one request-header buffer of common front ends (nginx's
/// `large_client_header_buffers`, Apache's `LimitRequestFieldSize`), so they cannot crowd out
/// a task's own headers there.
pub const QUEUE_HEADERS_MAX: usize = 32;
pub const QUEUE_HEADERS_BYTES_MAX: usize = 8 * 1024;

/// Longest delivery target a task may carry (a webhook URL, as long as a queue's may be).
pub const TARGET_LEN_MAX: usize = 2048;

/// Whether `name` is `.` or `..`: a URL path cannot carry either as a name (clients resolve
/// them as "this" and "the parent" segment, even percent-encoded, before sending), so names
/// that appear in paths (queues, task keys, user ids, schedule and reminder ids, token names)
/// may not be one.
pub fn is_dot_segment(name: &str) -> bool {
    name == "." || name == ".."
}

/// Longest idempotency key.
pub const IDEMPOTENCY_KEY_LEN_MAX: usize = 256;

/// Most delivery attempts a retry policy may allow.
pub const RETRY_ATTEMPTS_MAX: u32 = 1_000;

/// Longest retry delay a policy may set (30 days): a retry is never parked past the horizon,
/// where it would wait for good without a word.
pub const RETRY_BACKOFF_MS_MAX: u64 = 30 * 24 * 60 * 60 * 1000;

const _: () = assert!(LEASE_VISIBILITY_MS_MIN <= LEASE_VISIBILITY_MS_DEFAULT);
const _: () = assert!(LEASE_VISIBILITY_MS_DEFAULT <= LEASE_VISIBILITY_MS_MAX);
const _: () = assert!(LEASE_TASKS_MAX <= BATCH_TASKS_MAX);

/// Longest user id of a reminder subscription, in bytes. Ids are opaque; the bound keeps the
/// per-user index and a fan-out chunk's body predictable.
pub const USER_ID_LEN_MAX: usize = 128;
