//! Subcommands that talk to a running server through `belfry-client`, one module per noun.
//! Each sends one `Request`; `--json` prints the server's answer as received, otherwise the
//! answer is parsed and described for a person (see `show`).

mod cancel;
pub mod dead;
mod export;
pub mod queue;
pub mod reminder;
mod streamed;
pub mod task;

use std::collections::BTreeMap;
use std::io::Write;

/// Where the client subcommands send their requests, and how they print the answers. Their
/// help lists these under a heading of their own, after the command's own options.
#[derive(clap::Args)]
#[command(next_help_heading = "Server and output")]
pub struct Remote {
    /// The server's URL (http://HOST:PORT).
    #[arg(
        long,
        env = "BELFRY_SERVER",
        default_value = "http://127.0.0.1:7070",
        global = true
    )]
    pub server: String,
    /// PEM file of the CA (or the self-signed certificate) to trust for an https:// server.
    #[arg(long, env = "BELFRY_CA_FILE", global = true)]
    pub ca_file: Option<std::path::PathBuf>,
    /// Bearer token for a server that requires one (`[[auth.tokens]]`).
    #[arg(long, env = "BELFRY_TOKEN", global = true, hide_env_values = true)]
    pub token: Option<String>,
    /// Print the server's JSON answer exactly as received (nothing for an empty answer); an
    /// API error's code and message go to stdout too, as the server's error object.
    #[arg(long, global = true)]
    pub json: bool,
}

/// The token never shows in debug output.
impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote")
            .field("server", &self.server)
            .field("ca_file", &self.ca_file)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("json", &self.json)
            .finish()
    }
}

use anyhow::{anyhow, bail, Context};
use belfry_client::{Answer, Client, Request};
use serde::de::DeserializeOwned;

pub(crate) fn client(remote: &Remote) -> anyhow::Result<Client> {
    let mut client = Client::new(&remote.server)?;
    if let Some(path) = &remote.ca_file {
        let pem =
            std::fs::read(path).with_context(|| format!("--ca-file: read {}", path.display()))?;
        client = client
            .with_ca_pem(&pem)
            .with_context(|| format!("--ca-file {}", path.display()))?;
    }
    Ok(match &remote.token {
        Some(token) => client.with_token(token.trim()),
        None => client,
    })
}

/// Sends `request`; with `--json` prints the answer's body exactly as the server wrote it
/// (nothing for `204`), otherwise parses it as `T` and prints what `describe` makes of it.
pub(crate) async fn run<T: DeserializeOwned>(
    remote: &Remote,
    request: Request,
    describe: impl FnOnce(T) -> String,
) -> anyhow::Result<()> {
    let answer = send(remote, &request).await?;
    if remote.json {
        return print_raw(&answer);
    }
    let value: T = answer.json()?;
    say(describe(value))
}

/// Like `run`, for calls answered `204 No Content`: prints `done` unless `--json`.
pub(crate) async fn run_empty(
    remote: &Remote,
    request: Request,
    done: String,
) -> anyhow::Result<()> {
    let answer = send(remote, &request).await?;
    if remote.json {
        return print_raw(&answer);
    }
    say(done)
}

/// Prints one line of human output. A failed write is an error, not a panic: `main` ends
/// quietly when the reader went away (`| head`), and says why otherwise (`> /dev/full`).
pub(crate) fn say(line: impl std::fmt::Display) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .context("write the answer to stdout")
}

/// A command that printed its answer and must exit with status 1 without an error line: the
/// answer was "no" (`belfry reminder subscribers ID USER` for a user who is not subscribed),
/// as `grep` exits 1 when nothing matched.
#[derive(Debug)]
pub struct AnswerIsNo;

impl std::fmt::Display for AnswerIsNo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the answer is no")
    }
}

impl std::error::Error for AnswerIsNo {}

/// Whether `error` is [`AnswerIsNo`]: exit 1, having said everything already.
pub fn is_answer_no(error: &anyhow::Error) -> bool {
    error.downcast_ref::<AnswerIsNo>().is_some()
}

/// Whether `error` is stdout's reader having gone away (`belfry queue list | head -1`): the
/// command did its work, and like other command-line tools it ends quietly then.
pub fn is_broken_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Sends `request`. With `--json`, an API error's `{"error": {"code", "message"}}` also goes to
/// stdout, so a script reads every answer there (the exit status and stderr still say it
/// failed).
pub(crate) async fn send(remote: &Remote, request: &Request) -> anyhow::Result<Answer> {
    let sent = client(remote)?.send(request).await;
    if let Err(error) = &sent {
        print_api_error(remote, error)?;
    }
    Ok(sent?)
}

/// With `--json`, an API error's `{"error": {"code", "message"}}` on stdout, for calls that
/// do not go through [`send`].
pub(crate) fn print_api_error(remote: &Remote, error: &belfry_client::Error) -> anyhow::Result<()> {
    if let (true, belfry_client::Error::Api { code, message, .. }) = (remote.json, error) {
        let body = serde_json::json!({"error": {"code": code.as_str(), "message": message}});
        print_body(body.to_string().as_bytes())?;
    }
    Ok(())
}

/// The body byte for byte; a newline after it only at a terminal, so that a pipe gets exactly
/// what the server sent.
pub(crate) fn print_raw(answer: &Answer) -> anyhow::Result<()> {
    print_body(&answer.body)
}

pub(crate) fn print_body(body: &[u8]) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(body)?;
    if std::io::IsTerminal::is_terminal(&out) && !body.is_empty() {
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(())
}

/// The one line `main` prints for a failed command: the server's code and message, or for an
/// unreachable server which URL was tried and how to point at another.
pub fn error_line(error: &anyhow::Error) -> String {
    match error.downcast_ref::<belfry_client::Error>() {
        Some(belfry_client::Error::Unreachable { url, source }) => {
            let mut cause: &dyn std::error::Error = source;
            while let Some(next) = cause.source() {
                cause = next;
            }
            let text = cause.to_string();
            if text.contains("certificate") || text.contains("Certificate") {
                format!(
                    "the TLS certificate of {url} is not trusted ({text}): pass --ca-file (or \
                     BELFRY_CA_FILE) with the CA that signed it, or the certificate itself if \
                     self-signed with basicConstraints CA:FALSE (README, \"HTTPS\")"
                )
            } else if url.starts_with("https://") && text.contains("InvalidContentType") {
                format!(
                    "{url} did not answer TLS ({text}): the server there serves plain HTTP; \
                     use http:// or give the server a certificate ([tls], README \"HTTPS\")"
                )
            } else {
                format!(
                    "cannot reach belfry at {url} ({cause}); is `belfry serve` running there? \
                     Point --server or BELFRY_SERVER at it"
                )
            }
        }
        Some(belfry_client::Error::Api {
            code: belfry_client::ErrorCode::Unauthorized,
            ..
        }) => format!(
            "{} (the server requires a token: set BELFRY_TOKEN or pass --token; `belfry token create --offline` makes one for the server's config)",
            causes(error)
        ),
        // The server's advice names its route; here the command is what helps.
        Some(belfry_client::Error::Api {
            code: belfry_client::ErrorCode::QueueNotFound,
            ..
        }) => {
            let line = causes(error);
            match (line.find("; create it with PUT"), line.rfind(" (HTTP")) {
                (Some(from), Some(to)) if from < to => format!(
                    "{}; create it with `belfry queue create NAME`{}",
                    &line[..from],
                    &line[to..]
                ),
                _ => line,
            }
        }
        _ => causes(error),
    }
}

/// The error and its causes, joined by ": " as `{:#}` joins them, but each text once: many
/// errors (std's, reqwest's, some of ours) already end their own message with their cause's,
/// which `{:#}` then printed twice ("Not a directory (os error 20): Not a directory (os error
/// 20)").
pub fn causes(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

/// `--payload TEXT`: JSON, parsed here so a typo is reported before anything is sent.
pub(crate) fn parse_payload(text: Option<&str>) -> anyhow::Result<Option<serde_json::Value>> {
    text.map(|text| {
        serde_json::from_str(text).context("--payload must be JSON (quote strings: '\"hi\"')")
    })
    .transpose()
}

/// `--late POLICY [--late-after DURATION]`: what happens to a task found late (after an
/// outage), for a task, a queue's default or a schedule's firings.
#[derive(Debug, clap::Args)]
pub struct LateArgs {
    /// A task found later than --late-after (after an outage) is: fire (delivered however
    /// late), skip (finished undelivered) or dead (a dead letter).
    #[arg(long, value_name = "POLICY", value_parser = ["fire", "skip", "dead"])]
    pub late: Option<String>,
    /// How late a task may be and still be delivered, with --late skip or dead: "30s", "10m".
    #[arg(long, value_name = "DURATION", requires = "late")]
    pub late_after: Option<String>,
}

impl LateArgs {
    /// The policy and its threshold in ms, checked as the server checks them, but naming
    /// these flags.
    pub fn policy(&self) -> anyhow::Result<Option<(String, Option<u64>)>> {
        let Some(policy) = &self.late else {
            return Ok(None);
        };
        let after_ms = parse_ms("late-after", self.late_after.as_deref())?;
        match (policy.as_str(), after_ms) {
            ("fire", Some(_)) => {
                bail!("--late-after applies to --late skip or dead; fire delivers however late")
            }
            ("skip" | "dead", None) => {
                bail!("--late {policy} needs --late-after: how late a task may be and still be delivered")
            }
            _ => Ok(Some((policy.clone(), after_ms))),
        }
    }
}

/// Repeated `--header NAME=VALUE` flags.
/// `--header` values, "Name: value" each or NAME=VALUE (neither `:` nor `=` can be part of a
/// header name, so the first of them ends it), for tasks, schedules and a webhook queue's
/// fixed headers alike. A name given twice (in any case) is refused here, where the flags can
/// be named; the server checks the rest. An error never repeats a value: it may be a
/// credential, and command lines end up in logs.
pub(crate) fn parse_headers(flags: &[String]) -> anyhow::Result<BTreeMap<String, String>> {
    let mut headers = BTreeMap::new();
    for (i, header) in flags.iter().enumerate() {
        let Some((name, value)) = header.split_once([':', '=']) else {
            bail!(
                "--header takes \"Name: value\" (or NAME=VALUE); header {} of {} has neither ':' nor '='",
                i + 1,
                flags.len()
            );
        };
        let name = name.trim();
        if headers
            .keys()
            .any(|n: &String| n.eq_ignore_ascii_case(name))
        {
            bail!("--header {name:?} is given twice: header names are case-insensitive");
        }
        headers.insert(name.to_owned(), value.trim().to_owned());
    }
    Ok(headers)
}

/// A duration flag such as `--delay 10m`, in milliseconds.
pub(crate) fn parse_ms(flag: &str, text: Option<&str>) -> anyhow::Result<Option<u64>> {
    text.map(crate::units::parse_duration_ms)
        .transpose()
        .map_err(|e| anyhow!("--{flag}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error that ends its message with its cause's, as `#[error("...: {source}")]` does.
    #[derive(Debug)]
    struct Wrapping(std::io::Error);

    impl std::fmt::Display for Wrapping {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "list the data directory: {}", self.0)
        }
    }

    impl std::error::Error for Wrapping {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn a_cause_already_in_the_message_is_printed_once() {
        let io = std::io::Error::other("Not a directory");
        let error = anyhow::Error::new(Wrapping(io)).context("open the storage engine");
        assert_eq!(
            causes(&error),
            "open the storage engine: list the data directory: Not a directory"
        );
        let plain = anyhow!("no such file").context("--file: open users.ndjson");
        assert_eq!(causes(&plain), "--file: open users.ndjson: no such file");
    }
}
