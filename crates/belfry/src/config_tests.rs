//! The configuration's tests: parsing, environment overrides, resolution and its refusals.

use super::*;

#[test]
fn unknown_keys_are_named() {
    let err = parse("listen = \"127.0.0.1:1\"\nbogus = 1\n").unwrap_err();
    assert!(err.to_string().contains("bogus"), "{err}");
    let err = parse("[limits]\npayload_maxx = \"1 MiB\"\n").unwrap_err();
    assert!(err.to_string().contains("payload_maxx"), "{err}");
}

#[test]
fn shipped_example_parses() {
    let text = include_str!("../../../config/belfry.example.toml");
    let settings = parse(text).unwrap().resolve(None, None, None).unwrap();
    assert_eq!(settings.server.payload_bytes_max, 1024 * 1024);
    assert_eq!(settings.store, StoreKind::Engine);
}

/// The example documents every key an environment variable can set, with the variable.
#[test]
fn the_example_names_every_overridable_key() {
    let text = include_str!("../../../config/belfry.example.toml");
    for (var, key) in ENV_OVERRIDES.iter().chain(REDIS_ENV_OVERRIDES) {
        let name = key.rsplit('.').next().unwrap_or(key);
        assert!(
            text.contains(&format!("{name} =")) && text.contains(var),
            "config/belfry.example.toml does not document {key} ({var})"
        );
    }
}

#[test]
fn env_overrides_file_and_flags_override_env() {
    let mut file = parse("store = \"engine\"\n[limits]\nhorizon = \"1d\"\n").unwrap();
    file.apply_env(|var| match var {
        "BELFRY_HORIZON" => Some("2d".into()),
        "BELFRY_STORE" => Some("memory".into()),
        _ => None,
    })
    .unwrap();
    let settings = file
        .resolve(Some("127.0.0.1:9".into()), None, Some("engine".into()))
        .unwrap();
    assert_eq!(settings.server.horizon_ms, 2 * 86_400_000);
    assert_eq!(settings.store, StoreKind::Engine);
    assert_eq!(settings.server.listen.port(), 9);
}

#[test]
fn connections_parse_validate_and_take_env_overrides() {
    let text = r#"
[connections.main]
type = "redis"
url = "redis://127.0.0.1:6379/0"
password = "swordfish"

[connections.events]
type = "nats"
url = "nats://127.0.0.1:4222"

[connections.log]
type = "kafka"
brokers = ["127.0.0.1:9092"]
"#;
    let mut file = parse(text).unwrap();
    assert!(!format!("{file:?}").contains("swordfish"));
    file.apply_connection_env([
        (
            "BELFRY_CONNECTIONS__MAIN__URL".to_owned(),
            "redis://10.0.0.5:6379/1".to_owned(),
        ),
        (
            "BELFRY_CONNECTIONS__LOG__BROKERS".to_owned(),
            "a:9092, b:9092".to_owned(),
        ),
    ])
    .unwrap();
    let settings = file.resolve(None, None, None).unwrap();
    let main = settings.connections.get("main").unwrap();
    assert_eq!(main.url.as_deref(), Some("redis://10.0.0.5:6379/1"));
    assert_eq!(main.password.as_deref(), Some("swordfish"));
    assert_eq!(
        settings.connections.get("log").unwrap().brokers,
        vec!["a:9092".to_owned(), "b:9092".to_owned()]
    );
    assert_eq!(settings.connections.len(), 3);
    assert!(!format!("{settings:?}").contains("swordfish"));

    let check = |text: &str, needle: &str| {
        let err = match parse(text) {
            Err(err) => err,
            Ok(file) => file.resolve(None, None, None).unwrap_err(),
        };
        assert!(err.to_string().contains(needle), "{text}: {err}");
    };
    check("[connections.a]\ntype = \"redis\"\nurll = \"x\"\n", "urll");
    check(
        "[connections.a]\nurl = \"redis://x\"\n",
        "connections.a.type",
    );
    check("[connections.a]\ntype = \"mqtt\"\n", "connections.a.type");
    check("[connections.a]\ntype = \"nats\"\n", "connections.a.url");
    check(
        "[connections.a]\ntype = \"kafka\"\nbrokers = []\n",
        "connections.a.brokers",
    );
    check(
        "[connections.a]\ntype = \"redis\"\nurl = \"http://x\"\n",
        "connections.a.url",
    );
    let mut file = parse("").unwrap();
    let err = file
        .apply_connection_env([("BELFRY_CONNECTIONS__X__COLOUR".to_owned(), "1".to_owned())])
        .unwrap_err();
    assert!(err.to_string().contains("COLOUR"), "{err}");
}

/// A self-signed CA certificate, as PEM, at `path`.
fn write_ca(path: &Path) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    std::fs::write(path, params.self_signed(&key).unwrap().pem()).unwrap();
}

#[test]
fn connection_tls_maps_and_a_bad_ca_file_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    write_ca(&ca);
    let text = format!(
        "[connections.main]\ntype = \"redis\"\nurl = \"rediss://redis.internal:6380/0\"\n\
         [connections.main.tls]\nca_file = \"{}\"\n\
         [connections.flag]\ntype = \"redis\"\nurl = \"redis://redis.internal:6379/0\"\n\
         [connections.flag.tls]\nenabled = true\n",
        ca.display()
    );
    let settings = parse(&text).unwrap().resolve(None, None, None).unwrap();
    let main = settings.connections.get("main").unwrap();
    assert_eq!(main.tls.ca_file.as_deref(), Some(ca.as_path()));
    assert!(main.uses_tls() && !main.tls.enabled);
    assert!(settings.connections.get("flag").unwrap().tls.enabled);

    std::fs::write(&ca, "not a certificate\n").unwrap();
    let err = parse(&text)
        .unwrap()
        .resolve(None, None, None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("connections.main.tls.ca_file") && err.contains("holds no certificate"),
        "{err}"
    );
}

#[test]
fn webhooks_ca_file_maps_and_a_bad_one_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    write_ca(&ca);
    let text = format!("[webhooks]\nca_file = \"{}\"\n", ca.display());
    let settings = parse(&text).unwrap().resolve(None, None, None).unwrap();
    assert_eq!(
        settings.server.webhook_ca_file.as_deref(),
        Some(ca.as_path())
    );

    // The environment names it too.
    let mut file = parse("").unwrap();
    let shown = ca.display().to_string();
    file.apply_env(|var| (var == "BELFRY_WEBHOOKS_CA_FILE").then(|| shown.clone()))
        .unwrap();
    let settings = file.resolve(None, None, None).unwrap();
    assert_eq!(
        settings.server.webhook_ca_file.as_deref(),
        Some(ca.as_path())
    );

    let check = |text: &str, needle: &str| {
        let err = parse(text).unwrap().resolve(None, None, None).unwrap_err();
        let err = err.to_string();
        assert!(
            err.starts_with("webhooks.ca_file: ") && err.contains(needle),
            "{text}: {err}"
        );
    };
    check(
        "[webhooks]\nca_file = \"/no/such/ca.pem\"\n",
        "cannot read /no/such/ca.pem",
    );
    std::fs::write(&ca, "not a certificate\n").unwrap();
    check(&text, "holds no certificate");
}

#[test]
fn kafka_connections_take_sasl_and_tls_keys() {
    let text = r#"
[connections.log]
type = "kafka"
brokers = ["127.0.0.1:9093"]
username = "belfry"
password = "swordfish"
sasl_mechanism = "SCRAM-SHA-256"
"#;
    let mut file = parse(text).unwrap();
    file.apply_connection_env([(
        "BELFRY_CONNECTIONS__LOG__SASL_MECHANISM".to_owned(),
        "SCRAM-SHA-512".to_owned(),
    )])
    .unwrap();
    let settings = file.resolve(None, None, None).unwrap();
    let log = settings.connections.get("log").unwrap();
    assert_eq!(log.sasl_mechanism.as_deref(), Some("SCRAM-SHA-512"));
    assert!(!format!("{settings:?}").contains("swordfish"));

    let check = |text: &str, needle: &str| {
        let err = parse(text).unwrap().resolve(None, None, None).unwrap_err();
        assert!(err.to_string().contains(needle), "{text}: {err}");
    };
    let kafka = "[connections.log]\ntype = \"kafka\"\nbrokers = [\"h:1\"]\n";
    check(
        &format!("{kafka}username = \"u\"\npassword = \"p\"\nsasl_mechanism = \"MD5\"\n"),
        "connections.log.sasl_mechanism",
    );
    check(
        &format!("{kafka}[connections.log.tls]\nenabled = true\nca_file = \"/no/such/ca.pem\"\n"),
        "connections.log.tls.ca_file: cannot read",
    );
}

#[test]
fn bad_values_name_the_key() {
    let err = parse("[limits]\npayload_max = \"1 parsec\"\n")
        .unwrap()
        .resolve(None, None, None)
        .unwrap_err();
    assert!(err.to_string().contains("limits.payload_max"), "{err}");
    let err = parse("[storage]\nfsync = \"sometimes\"\n")
        .unwrap()
        .resolve(None, None, None)
        .unwrap_err();
    assert!(err.to_string().contains("storage.fsync"), "{err}");
}

/// A duration or size of the wrong type says what it should be, not a Rust type's name.
#[test]
fn a_mistyped_duration_or_size_says_what_is_expected() {
    let err = parse("[limits]\nhorizon = -5\n").unwrap_err();
    assert!(format!("{err:#}").contains("a duration such as"), "{err:#}");
    let err = parse("[limits]\npayload_max = true\n").unwrap_err();
    assert!(format!("{err:#}").contains("a size such as"), "{err:#}");
}

/// The engine's checkpoint threshold and free-space reserve (issue #12: the docs and the
/// advice after a full disk name them), from the file or the environment, in human sizes.
#[test]
fn the_checkpoint_threshold_and_the_free_space_reserve_are_settable() {
    let settings = parse("").unwrap().resolve(None, None, None).unwrap();
    assert_eq!(
        settings.checkpoint_wal_bytes,
        belfry_store::CHECKPOINT_WAL_BYTES_DEFAULT
    );
    assert_eq!(
        settings.free_space_reserve_bytes,
        belfry_store::FREE_SPACE_RESERVE_BYTES_DEFAULT
    );
    let text = "[storage]\ncheckpoint_wal_bytes = \"4 MiB\"\nfree_space_reserve = \"16 MiB\"\n";
    let settings = parse(text).unwrap().resolve(None, None, None).unwrap();
    assert_eq!(settings.checkpoint_wal_bytes, 4 << 20);
    assert_eq!(settings.free_space_reserve_bytes, 16 << 20);
    let mut file = parse(text).unwrap();
    file.apply_env(|var| match var {
        "BELFRY_STORAGE_CHECKPOINT_WAL_BYTES" => Some("1 MiB".into()),
        "BELFRY_STORAGE_FREE_SPACE_RESERVE" => Some("0".into()),
        _ => None,
    })
    .unwrap();
    let settings = file.resolve(None, None, None).unwrap();
    assert_eq!(settings.checkpoint_wal_bytes, 1 << 20);
    assert_eq!(settings.free_space_reserve_bytes, 0);
    let err = parse("[storage]\ncheckpoint_wal_bytes = \"1 KiB\"\n")
        .unwrap()
        .resolve(None, None, None)
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("storage.checkpoint_wal_bytes: must be at least 64 KiB"),
        "{err}"
    );
    let err = parse("[storage]\nfree_space_reserve = \"lots\"\n")
        .unwrap()
        .resolve(None, None, None)
        .unwrap_err();
    assert!(
        err.to_string().contains("storage.free_space_reserve"),
        "{err}"
    );
    let mut file = parse("").unwrap();
    let err = file
        .apply_env(|var| (var == "BELFRY_STORAGE_FREE_SPACE_RESERVE").then(|| "big".into()))
        .unwrap_err();
    assert!(
        format!("{err:#}")
            .contains("BELFRY_STORAGE_FREE_SPACE_RESERVE (overrides storage.free_space_reserve)"),
        "{err:#}"
    );
}

/// An interval of 0 would spin the flusher on a core; an interval without its mode would
/// be ignored without a word.
#[test]
fn an_fsync_interval_is_above_zero_and_only_with_its_mode() {
    let resolve = |text: &str| parse(text).unwrap().resolve(None, None, None);
    let zero = resolve("[storage]\nfsync = \"interval\"\nfsync_interval = \"0ms\"\n");
    assert!(
        format!("{:#}", zero.unwrap_err()).contains("must be longer than 0"),
        "zero"
    );
    let alone = resolve("[storage]\nfsync_interval = \"10ms\"\n").unwrap_err();
    assert!(
        format!("{alone:#}").contains("applies only with storage.fsync = \"interval\""),
        "{alone:#}"
    );
    assert!(resolve("[storage]\nfsync = \"interval\"\nfsync_interval = \"10ms\"\n").is_ok());
}

#[test]
fn log_levels_are_levels_or_target_directives() {
    let level = |text: &str| {
        parse(&format!("[log]\nlevel = \"{text}\"\n"))
            .unwrap()
            .resolve(None, None, None)
            .map(|c| c.log_level)
    };
    for good in [
        "info",
        "DEBUG",
        "belfry_server=debug,info",
        "warn,hyper=off",
    ] {
        assert_eq!(level(good).unwrap(), good);
    }
    // A bare word is a target to tracing: a typo would have turned logging off.
    for bad in ["loud", "inf", "info,,", "belfry=verbose"] {
        let err = level(bad).unwrap_err().to_string();
        assert!(
            err.contains("log.level") && err.contains("not a level"),
            "{bad}: {err}"
        );
    }
}

#[test]
fn store_call_timeout_defaults_parses_takes_env_and_refuses_zero_or_junk() {
    let resolve = |text: &str| parse(text).unwrap().resolve(None, None, None);
    assert_eq!(resolve("").unwrap().server.store_call_timeout_ms, 5_000);
    let set = resolve("[limits]\nstore_call_timeout = \"750ms\"\n").unwrap();
    assert_eq!(set.server.store_call_timeout_ms, 750);
    let mut file = parse("").unwrap();
    file.apply_env(|var| (var == "BELFRY_STORE_CALL_TIMEOUT").then(|| "2s".into()))
        .unwrap();
    let from_env = file.resolve(None, None, None).unwrap();
    assert_eq!(from_env.server.store_call_timeout_ms, 2_000);
    for bad in ["0s", "soon"] {
        let err = resolve(&format!("[limits]\nstore_call_timeout = \"{bad}\"\n")).unwrap_err();
        assert!(
            err.to_string().contains("limits.store_call_timeout"),
            "{bad}: {err}"
        );
    }
}

#[test]
fn import_body_max_defaults_parses_takes_env_and_refuses_junk() {
    let resolve = |text: &str| parse(text).unwrap().resolve(None, None, None);
    assert_eq!(
        resolve("").unwrap().server.import_body_bytes_max,
        1024 * 1024 * 1024
    );
    let set = resolve("[limits]\nimport_body_max = \"64 MiB\"\n").unwrap();
    assert_eq!(set.server.import_body_bytes_max, 64 * 1024 * 1024);
    let mut file = parse("").unwrap();
    file.apply_env(|var| (var == "BELFRY_IMPORT_BODY_MAX").then(|| "2 GiB".into()))
        .unwrap();
    let from_env = file.resolve(None, None, None).unwrap();
    assert_eq!(
        from_env.server.import_body_bytes_max,
        2 * 1024 * 1024 * 1024
    );
    let err = resolve("[limits]\nimport_body_max = \"lots\"\n").unwrap_err();
    assert!(
        format!("{err:#}").contains("limits.import_body_max"),
        "{err:#}"
    );
    let mut file = parse("").unwrap();
    let err = file
        .apply_env(|var| (var == "BELFRY_IMPORT_BODY_MAX").then(|| "lots".into()))
        .unwrap_err();
    assert!(
        format!("{err:#}").contains("BELFRY_IMPORT_BODY_MAX (overrides limits.import_body_max)"),
        "{err:#}"
    );
}

/// A number with no unit means milliseconds only as a TOML integer; as a string (every
/// environment variable is one) it is refused, naming the variable, rather than guessed.
#[test]
fn a_duration_string_without_a_unit_is_refused() {
    let resolve = |text: &str| parse(text).unwrap().resolve(None, None, None);
    let integer = resolve("[http]\nidle_timeout = 1000\n").unwrap();
    assert_eq!(integer.server.http_idle_timeout_ms, 1_000);
    let err = resolve("[http]\nidle_timeout = \"1000\"\n").unwrap_err();
    let text = format!("{err:#}");
    assert!(text.contains("http.idle_timeout"), "{text}");
    assert!(text.contains("\"1000ms\" or \"1000s\""), "{text}");
    let mut file = parse("").unwrap();
    let err = file
        .apply_env(|var| (var == "BELFRY_SHUTDOWN_GRACE").then(|| "30000".into()))
        .unwrap_err();
    let text = format!("{err:#}");
    assert!(
        text.contains("BELFRY_SHUTDOWN_GRACE (overrides shutdown.grace)"),
        "{text}"
    );
    assert_eq!(
        text.matches("\"30000\"").count(),
        1,
        "the value once: {text}"
    );
    // Sizes too name the variable, not only the key.
    let mut file = parse("").unwrap();
    let err = file
        .apply_env(|var| (var == "BELFRY_PAYLOAD_MAX").then(|| "huge".into()))
        .unwrap_err();
    assert!(
        format!("{err:#}").contains("BELFRY_PAYLOAD_MAX (overrides limits.payload_max)"),
        "{err:#}"
    );
    let mut file = parse("").unwrap();
    file.apply_env(|var| (var == "BELFRY_HTTP_IDLE_TIMEOUT").then(|| "0".into()))
        .unwrap_or_else(|e| panic!("0 needs no unit: {e:#}"));
}

#[test]
fn schedules_lead_defaults_parses_takes_env_and_refuses_over_a_minute() {
    let resolve = |text: &str| parse(text).unwrap().resolve(None, None, None);
    assert_eq!(resolve("").unwrap().server.schedule_lead_ms, 500);
    let set = resolve("[schedules]\nlead = \"2s\"\n").unwrap();
    assert_eq!(set.server.schedule_lead_ms, 2_000);
    let off = resolve("[schedules]\nlead = \"0ms\"\n").unwrap();
    assert_eq!(off.server.schedule_lead_ms, 0);
    let mut file = parse("").unwrap();
    file.apply_env(|var| (var == "BELFRY_SCHEDULES_LEAD").then(|| "250ms".into()))
        .unwrap();
    assert_eq!(
        file.resolve(None, None, None)
            .unwrap()
            .server
            .schedule_lead_ms,
        250
    );
    for bad in ["2m", "soon"] {
        let err = resolve(&format!("[schedules]\nlead = \"{bad}\"\n")).unwrap_err();
        assert!(err.to_string().contains("schedules.lead"), "{bad}: {err}");
    }
}

#[test]
fn connection_guards_default_parse_take_env_and_validate() {
    let defaults = parse("").unwrap().resolve(None, None, None).unwrap().server;
    assert_eq!(defaults.http_listen_backlog, 1_024);
    assert_eq!(defaults.http_connections_per_client_max, None);
    assert_eq!(
        defaults.http_connections_per_client_cap(),
        2_500,
        "by default a quarter of http.connections_max"
    );
    let lowered = parse("[http]\nconnections_max = 100\n")
        .unwrap()
        .resolve(None, None, None)
        .unwrap()
        .server;
    assert_eq!(lowered.http_connections_per_client_cap(), 25);

    let text = "[http]\nlisten_backlog = 4096\nconnections_per_client_max = 300\n";
    let from_file = parse(text).unwrap().resolve(None, None, None).unwrap();
    assert_eq!(from_file.server.http_listen_backlog, 4_096);
    assert_eq!(from_file.server.http_connections_per_client_cap(), 300);

    let mut file = parse(text).unwrap();
    file.apply_env(|var| match var {
        "BELFRY_HTTP_LISTEN_BACKLOG" => Some("512".into()),
        "BELFRY_HTTP_CONNECTIONS_PER_CLIENT_MAX" => Some("10000".into()),
        _ => None,
    })
    .unwrap();
    let from_env = file.resolve(None, None, None).unwrap().server;
    assert_eq!(from_env.http_listen_backlog, 512);
    assert_eq!(from_env.http_connections_per_client_cap(), 10_000);

    for (bad, key) in [
        ("[http]\nlisten_backlog = 0\n", "http.listen_backlog"),
        ("[http]\nlisten_backlog = 70000\n", "http.listen_backlog"),
        (
            "[http]\nconnections_per_client_max = 0\n",
            "http.connections_per_client_max",
        ),
        (
            "[http]\nconnections_max = 10\nconnections_per_client_max = 11\n",
            "http.connections_per_client_max",
        ),
    ] {
        let err = parse(bad).unwrap().resolve(None, None, None).unwrap_err();
        assert!(err.to_string().contains(key), "{bad}: {err}");
    }
    let mut file = parse("").unwrap();
    let err = file
        .apply_env(|var| (var == "BELFRY_HTTP_LISTEN_BACKLOG").then(|| "lots".into()))
        .unwrap_err();
    assert!(err.to_string().contains("http.listen_backlog"), "{err}");
}

#[test]
fn node_id_defaults_unique_and_takes_file_env_and_flag() {
    let first = parse("").unwrap().resolve(None, None, None).unwrap();
    let second = parse("").unwrap().resolve(None, None, None).unwrap();
    let (a, b) = (&first.server.node_id, &second.server.node_id);
    assert_ne!(a, b, "two defaults in one process differ");
    assert!(
        a.contains(&format!("-{}-", std::process::id())),
        "the default names the process: {a}"
    );
    assert!(belfry_server::config::check_node_id(a).is_ok(), "{a}");

    let mut file = parse("node_id = \"from-file\"\n").unwrap();
    assert_eq!(
        parse("node_id = \"from-file\"\n")
            .unwrap()
            .resolve(None, None, None)
            .unwrap()
            .server
            .node_id,
        "from-file"
    );
    file.apply_env(|var| (var == "BELFRY_NODE_ID").then(|| "from-env".into()))
        .unwrap();
    assert_eq!(file.node_id.as_deref(), Some("from-env"));
    // The flag is applied by the command line over the environment, as `cli` does.
    file.node_id = Some("node-7".into());
    assert_eq!(
        file.resolve(None, None, None).unwrap().server.node_id,
        "node-7"
    );

    for bad in ["", "has space", "tab\there", &"x".repeat(129)] {
        let text = format!("node_id = {bad:?}\n");
        let err = parse(&text).unwrap().resolve(None, None, None).unwrap_err();
        assert!(err.to_string().contains("node_id"), "{bad:?}: {err}");
    }
}

#[test]
fn settings_the_chosen_store_ignores_are_warned_about() {
    let warnings = |text: &str| {
        parse(text)
            .unwrap()
            .resolve(None, None, None)
            .unwrap()
            .warnings
    };
    let on_memory =
        warnings("store = \"memory\"\n[storage]\nfsync = \"never\"\n[redis]\nnamespace = \"x\"\n");
    assert_eq!(
        on_memory,
        [
            "storage.fsync is set but does nothing on the memory store",
            "redis.namespace is set but does nothing on the memory store"
        ]
    );
    let on_redis = warnings("store = \"redis://127.0.0.1:6379\"\n[storage]\nfsync = \"always\"\n");
    assert_eq!(
        on_redis,
        ["storage.fsync is set but does nothing on a Redis store"]
    );
    let on_engine = warnings("[storage]\nfsync = \"never\"\n[redis]\npartitions = 8\n");
    assert_eq!(
        on_engine,
        ["redis.partitions is set but does nothing on the embedded store"]
    );
    assert!(warnings("[storage]\nfsync = \"never\"\n").is_empty());
}

#[test]
fn shutdown_waits_are_bounded() {
    let resolve = |text: &str| parse(text).unwrap().resolve(None, None, None);
    let err = resolve("[shutdown]\ndrain_delay = \"1y\"\n").unwrap_err();
    assert!(
        err.to_string()
            .contains("shutdown.drain_delay: at most 10m"),
        "{err}"
    );
    let err = resolve("[shutdown]\ngrace = \"2h\"\n").unwrap_err();
    assert!(
        err.to_string().contains("shutdown.grace: at most 10m"),
        "{err}"
    );
    assert!(resolve("[shutdown]\ndrain_delay = \"30s\"\ngrace = \"10m\"\n").is_ok());
}
