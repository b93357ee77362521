//! SASL against Tansu started with `--authentication`.
//!
//! What this Tansu (0.6) can and cannot show, and so what these tests pin:
//! - it offers SCRAM-SHA-256 and SCRAM-SHA-512 only; a PLAIN login ends in
//!   `NoSharedMechanism` on the broker;
//! - its users live in its storage, and the only storage usable here (memory) starts empty;
//!   `tansu user create` sends its request without logging in, which a broker with
//!   `--authentication` refuses (`NotAuthenticated`). So no user can be made, and a login
//!   that succeeds cannot be tested against it: the tests cover the refusals (a SCRAM login
//!   of an unknown user), which are the outcomes the sink has to classify.

use super::*;

fn sasl_connection(
    broker: &str,
    mechanism: Option<&str>,
    user: &str,
    password: &str,
) -> ConnectionSpec {
    ConnectionSpec {
        username: Some(user.to_owned()),
        password: Some(password.to_owned()),
        sasl_mechanism: mechanism.map(str::to_owned),
        ..ConnectionSpec::kafka([broker])
    }
}

/// The outcome of one delivery through a fresh sink on `connection`.
async fn deliver_once(connection: ConnectionSpec) -> Outcome {
    sink(connection).deliver(&task(1, b"{}"), 1, 0).await
}

#[tokio::test]
async fn a_scram_login_the_broker_refuses_is_a_rejection() {
    let tansu = Tansu::start(None, true).await;
    for mechanism in ["SCRAM-SHA-256", "SCRAM-SHA-512"] {
        let connection = sasl_connection(&tansu.broker(), Some(mechanism), "nobody", "pw");
        // Tansu ends the SCRAM exchange with "unknown user": a refusal, so a dead letter
        // (before the delivery's limit: the client's own deadline is shorter).
        match deliver_once(connection).await {
            Outcome::Reject { reason } => assert!(
                reason.contains("authentication refused") && reason.contains("unknown user"),
                "{mechanism}: {reason}"
            ),
            other => panic!("{mechanism}: expected a rejection, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_mechanism_the_broker_does_not_offer_is_never_delivered() {
    let tansu = Tansu::start(None, true).await;
    // No sasl_mechanism: PLAIN, which this Tansu does not offer; it closes the connection
    // instead of answering `UnsupportedSaslMechanism`, which reads as a lost connection.
    let outcome = deliver_once(sasl_connection(&tansu.broker(), None, "svc", "pw")).await;
    match outcome {
        Outcome::Retry { reason, .. } => {
            assert!(reason.contains("Sasl handshake failed"), "{reason}")
        }
        other => panic!("expected a retry, got {other:?}"),
    }
}

#[tokio::test]
async fn no_credentials_against_an_authenticating_broker_is_retried() {
    let tansu = Tansu::start(None, true).await;
    let outcome = deliver_once(ConnectionSpec::kafka([tansu.broker()])).await;
    // Tansu closes the connection of a client that did not log in; that reads as a
    // connection failure, which is retried.
    match outcome {
        Outcome::Retry { reason, .. } => assert!(reason.contains("connection"), "{reason}"),
        other => panic!("expected a retry, got {other:?}"),
    }
}

#[test]
fn sasl_keys_are_validated_with_the_key_named() {
    let check = |spec: ConnectionSpec, needle: &str| {
        let error = spec.validate("k").unwrap_err();
        assert!(error.contains(needle), "{error}");
    };
    check(
        sasl_connection("h:1", Some("GSSAPI"), "u", "p"),
        "connections.k.sasl_mechanism: expected one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512",
    );
    check(
        ConnectionSpec {
            sasl_mechanism: Some("PLAIN".into()),
            ..ConnectionSpec::kafka(["h:1"])
        },
        "connections.k.sasl_mechanism: needs a username",
    );
    check(
        ConnectionSpec {
            username: Some("u".into()),
            ..ConnectionSpec::kafka(["h:1"])
        },
        "connections.k.password",
    );
    check(
        ConnectionSpec {
            sasl_mechanism: Some("PLAIN".into()),
            ..ConnectionSpec::url(belfry_sinks::ConnectionKind::Nats, "nats://h:4222")
        },
        "connections.k.sasl_mechanism: only kafka",
    );
    for mechanism in ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] {
        assert_eq!(
            sasl_connection("h:1", Some(mechanism), "u", "p").validate("k"),
            Ok(())
        );
    }
}
