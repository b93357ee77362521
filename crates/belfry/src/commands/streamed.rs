//! Files streamed to the server's bulk routes (subscribers, task imports), with a progress
//! bar of the bytes sent.

use std::path::Path;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};

use anyhow::{anyhow, bail, Context};
use belfry_client::BulkBody;
use serde::Serialize;

use super::{print_api_error, print_body, say, Remote};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio::io::{AsyncRead, ReadBuf};

/// The file `flag` names (or stdin for `-`) as a streamed body, counting the bytes read on a progress bar
/// on stderr, drawn only when stderr is a terminal.
pub(crate) async fn file_body(flag: &str, path: &Path) -> anyhow::Result<(BulkBody, ProgressBar)> {
    let (reader, len): (Box<dyn AsyncRead + Send + Unpin>, Option<u64>) = if path == Path::new("-")
    {
        (Box::new(tokio::io::stdin()), None)
    } else {
        let file = tokio::fs::File::open(path)
            .await
            .with_context(|| format!("{flag}: open {}", path.display()))?;
        let meta = file
            .metadata()
            .await
            .with_context(|| format!("{flag}: read {}", path.display()))?;
        if meta.is_dir() {
            bail!("{flag}: {} is a directory", path.display());
        }
        let len = meta.is_file().then_some(meta.len());
        (Box::new(file), len)
    };
    let bar = ProgressBar::with_draw_target(len, ProgressDrawTarget::stderr());
    let style = match len {
        Some(_) => ProgressStyle::with_template(
            "{bar:40} {bytes}/{total_bytes} ({bytes_per_sec}, {eta} left)",
        ),
        None => ProgressStyle::with_template("{spinner} {bytes} sent ({bytes_per_sec})"),
    }
    .map_err(|e| anyhow!("progress bar template: {e}"))?;
    bar.set_style(style);
    let counted = Counted {
        inner: reader,
        bar: bar.clone(),
    };
    Ok((BulkBody::reader(counted), bar))
}

/// A bar on stderr (drawn only at a terminal) of `noun` done, out of `total` when it is known,
/// else a counter: what every command that walks many tasks shows.
pub(crate) fn count_bar(total: Option<u64>, noun: &str) -> anyhow::Result<ProgressBar> {
    let bar = ProgressBar::with_draw_target(total, ProgressDrawTarget::stderr());
    let template = match total {
        Some(_) => format!("{{bar:40}} {{pos}}/{{len}} {noun} ({{per_sec}}, {{eta}} left)"),
        None => format!("{{spinner}} {{pos}} {noun} ({{per_sec}})"),
    };
    let style = ProgressStyle::with_template(&template)
        .map_err(|e| anyhow!("progress bar template: {e}"))?;
    bar.set_style(style);
    Ok(bar)
}

/// Counts the bytes read from `inner` on a progress bar.
struct Counted<R> {
    inner: R,
    bar: ProgressBar,
}

impl<R: AsyncRead + Unpin> AsyncRead for Counted<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = &polled {
            self.bar.inc((buf.filled().len() - before) as u64);
        }
        polled
    }
}

/// Prints what a bulk call answered: the answer, or the counts of one that stopped part way
/// (`stopped` finds them in its error), as JSON with `--json` or as `describe` words it; any
/// other error as every command prints one. Returns the call's outcome (an import that
/// stopped part way fails the command, after its counts are printed).
pub(crate) fn report<A: Serialize>(
    remote: &Remote,
    result: Result<A, belfry_client::Error>,
    stopped: fn(&belfry_client::Error) -> Option<&A>,
    describe: impl Fn(&A) -> String,
) -> anyhow::Result<()> {
    let answer = match &result {
        Ok(answer) => answer,
        Err(error) => match stopped(error) {
            Some(answer) => answer,
            None => {
                print_api_error(remote, error)?;
                return result.map(|_| ()).map_err(Into::into);
            }
        },
    };
    if remote.json {
        print_body(&serde_json::to_vec(answer)?)?;
    } else {
        say(describe(answer))?;
    }
    result.map(|_| ()).map_err(Into::into)
}
