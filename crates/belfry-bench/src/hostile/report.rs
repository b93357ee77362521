//! The hostile scenario's tables and notes.

use crate::report::{ratio, thousands, Report, Table};
use crate::stats::format_us;
use crate::sys::Machine;

use super::{HostileOutcome, OpenCount, Phase, SeriesOutcome, KINDS, P99_RATIO_TARGET};

/// The server's connection cap when the run does not set one: `http.connections_max`'s
/// default (`HTTP_CONNECTIONS_MAX_DEFAULT` in the server's config), repeated because the
/// bench speaks only the HTTP contract.
pub const SERVER_CONNECTIONS_MAX_DEFAULT: u64 = 10_000;

/// Whether one series missed the target: a failed request while held, or its p99 held over
/// target × its p99 with none (or no baseline p99 to compare with).
fn missed(b: &SeriesOutcome, h: &SeriesOutcome) -> bool {
    h.failed > 0
        || b.latency.p99_us == 0
        || h.latency.p99_us as f64 > b.latency.p99_us as f64 * P99_RATIO_TARGET
}

/// The connection cap the server ran with, as far as the bench can tell.
fn server_cap(o: &HostileOutcome) -> String {
    o.server_env
        .iter()
        .find_map(|kv| kv.strip_prefix("BELFRY_HTTP_CONNECTIONS_MAX="))
        .map(|v| format!("{v} (set for this run)"))
        .unwrap_or_else(|| {
            format!(
                "{} (the default)",
                thousands(SERVER_CONNECTIONS_MAX_DEFAULT as f64)
            )
        })
}

/// The per-client connection cap the server ran with, as far as the bench can tell.
fn per_client_cap(o: &HostileOutcome) -> String {
    o.server_env
        .iter()
        .find_map(|kv| kv.strip_prefix("BELFRY_HTTP_CONNECTIONS_PER_CLIENT_MAX="))
        .map(|v| format!("{v} (set for this run)"))
        .unwrap_or_else(|| "a quarter of the connection cap (the default)".to_string())
}

fn open_text(c: &OpenCount) -> String {
    if c.samples == 0 {
        return "-".into();
    }
    format!(
        "{}–{} (mean {})",
        thousands(c.min as f64),
        thousands(c.max as f64),
        thousands(c.mean)
    )
}

fn cores(phase: &Phase) -> String {
    format!(
        "server {}, bench {:.2}",
        phase
            .cpu
            .server_cores
            .map_or("-".into(), |c| format!("{c:.2}")),
        phase.cpu.client_cores
    )
}

fn tcp_text(phase: &Phase) -> String {
    phase.tcp.map_or("-".into(), |t| {
        format!(
            "{} / {}",
            thousands(t.listen_overflows as f64),
            thousands(t.syn_retransmits as f64)
        )
    })
}

pub fn build(machine: Machine, o: HostileOutcome) -> Report {
    let mut latency = Table::new(
        format!(
            "latency with {} partial connections held against none, same server, same run \
             ({} rounds per phase, one every {} ms)",
            thousands(o.hostile as f64),
            o.rounds,
            o.interval_ms
        ),
        &[
            "request",
            "connection",
            "none held p50",
            "p99",
            "held p50",
            "p99",
            "max",
            "p99 held ÷ none",
            "failed (none / held)",
        ],
    );
    for (b, h) in o.baseline.series.iter().zip(&o.held.series) {
        latency.row(vec![
            b.request.label().to_string(),
            b.connection.label().to_string(),
            format_us(b.latency.p50_us),
            format_us(b.latency.p99_us),
            format_us(h.latency.p50_us),
            format_us(h.latency.p99_us),
            format_us(h.latency.max_us),
            ratio(h.latency.p99_us as f64, b.latency.p99_us as f64),
            format!("{} / {}", b.failed, h.failed),
        ]);
    }
    Report {
        scenario: "hostile".into(),
        command: crate::command_line(),
        machine,
        tables: vec![latency, held_table(&o)],
        notes: notes(&o),
        picture: None,
        data: serde_json::to_value(&o).unwrap_or(serde_json::Value::Null),
    }
}

fn held_table(o: &HostileOutcome) -> Table {
    let p = &o.held_phase_holders;
    let mut held = Table::new(
        "hostile connections during the measured phase".to_string(),
        &[
            "held (client's count)",
            "accepted by the server (its extra sockets)",
            "closed by the server",
            "re-opened",
            "failed connects",
            "refused (503, per-client cap)",
            "CPU cores, none held",
            "held",
            "listen-queue overflows / SYN retransmits, none held",
            "held",
        ],
    );
    held.row(vec![
        open_text(&o.held.hostile_open),
        o.held
            .server_sockets_extra
            .as_ref()
            .map_or("-".into(), open_text),
        thousands(p.closed_by_server as f64),
        thousands(p.opened as f64),
        thousands(p.connect_errors as f64),
        thousands(p.refused as f64),
        cores(&o.baseline),
        cores(&o.held),
        tcp_text(&o.baseline),
        tcp_text(&o.held),
    ]);
    held
}

fn notes(o: &HostileOutcome) -> Vec<String> {
    let mut notes = vec![target_note(o)];
    notes.push(format!(
        "hostile connections: {} of each kind ({}), on a thread of their own; each is \
         re-opened as soon as the server closes it, so the count holds through the measured \
         phase. {}",
        thousands((o.hostile / KINDS.len()) as f64),
        KINDS.join("; "),
        match o.opening_s {
            Some(s) if o.holders.refused > 0 => format!(
                "All {} had connected {s:.1} s after the first connect; the server answered \
                 those over its per-client cap 503 and closed them, and they re-opened at once.",
                thousands(o.hostile as f64)
            ),
            Some(s) => format!(
                "All {} were open {s:.1} s after the first connect.",
                thousands(o.hostile as f64)
            ),
            None => format!(
                "They did not all open within the opening deadline; the phase measured with \
                 {} open at most.",
                thousands(o.held.hostile_open.max as f64)
            ),
        }
    ));
    notes.push(format!(
        "the server ran with its default timeouts (idle 5 s, headers 10 s, body 30 s), \
         connection cap {} and per-client cap {}: the client's count includes connections the \
         kernel completed but the server had not accepted (its listen backlog); the server's \
         extra sockets are the ones it accepted, counted just after the probe rounds (counting \
         them during the rounds cost the bench enough CPU to delay its own probes).",
        server_cap(o),
        per_client_cap(o)
    ));
    notes.push(format!(
        "the hostile connections came from {}, the probes from 127.0.0.1: the server tells \
         clients apart by source address.",
        source_text(o)
    ));
    notes.push(
        "listen-queue overflows and SYN retransmits are the kernel's counters over each phase \
         (machine-wide): a handshake the server's accept queue had no room for is dropped, and \
         its client connects only when it sends its SYN again, a second or more later."
            .to_string(),
    );
    notes.push(format!(
        "open-files limit: {} for the bench (raised to its hard limit), {} for the server \
         (inherited).",
        thousands(o.open_files_limit as f64),
        o.server_open_files_limit
            .map_or("unknown".into(), |l| thousands(l as f64))
    ));
    notes.push(format!(
        "\"kept alive\": one connection per phase, opened when the phase starts (in the held \
         phase, after the hostile connections), requests in sequence; \"new per request\": \
         each round opens its own connection, whatever the earlier ones are doing, and its \
         latency includes the connect. A request that fails or takes over {} s counts as \
         failed and is recorded at its latency.",
        super::PROBE_TIMEOUT.as_secs()
    ));
    if o.held.cpu.client_saturated() {
        notes.push(format!(
            "the bench used {:.2} cores while the connections were held (it shares the \
             machine with the server).",
            o.held.cpu.client_cores
        ));
    }
    notes
}

/// The hostile connections' addresses: one, or the first and last of a range.
fn source_text(o: &HostileOutcome) -> String {
    let all = super::holders::sources(o.hostile_source, o.hostile_sources).unwrap_or_default();
    match all.as_slice() {
        [] | [_] => o.hostile_source.to_string(),
        [first, .., last] => format!(
            "{} addresses, {first} to {last} (about {} connections each)",
            all.len(),
            thousands((o.hostile / all.len()) as f64)
        ),
    }
}

fn target_note(o: &HostileOutcome) -> String {
    let misses: Vec<String> = o
        .baseline
        .series
        .iter()
        .zip(&o.held.series)
        .filter(|(b, h)| missed(b, h))
        .map(|(b, h)| {
            format!(
                "{}, {} ({})",
                b.request.label(),
                b.connection.label(),
                ratio(h.latency.p99_us as f64, b.latency.p99_us as f64)
            )
        })
        .collect();
    format!(
        "target (issue #12) p99 with {} partial connections held ≤ {P99_RATIO_TARGET}× the p99 \
         with none, no failed request: {}",
        thousands(o.hostile as f64),
        if misses.is_empty() {
            "met for every request and connection kind.".to_string()
        } else {
            format!("MISSED for {}.", misses.join("; "))
        }
    )
}
