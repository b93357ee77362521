//! A thread of the server's own that runs calls one at a time at a lower CPU priority (a
//! higher nice value) than the request workers: work with seconds of slack, such as the
//! reminders' fan-out, yields the cores to requests that have none.

use crate::shared::ServiceError;

/// A thread that runs calls one at a time at a nice value. It ends when the last handle to
/// it is dropped; a call that panics is reported to its caller and the thread goes on.
pub(crate) struct LowPriorityThread {
    name: String,
    calls: std::sync::mpsc::Sender<Box<dyn FnOnce() + Send>>,
}

impl LowPriorityThread {
    pub(crate) fn start(name: &str, nice: i32) -> std::io::Result<Self> {
        let (calls, queued) = std::sync::mpsc::channel::<Box<dyn FnOnce() + Send>>();
        let thread = name.to_owned();
        std::thread::Builder::new()
            .name(thread.clone())
            .spawn(move || {
                if let Err(error) = lower_this_threads_priority(nice) {
                    tracing::warn!(%error, thread, nice, "could not lower the thread's CPU priority");
                }
                for call in queued {
                    // The caller sees a panic as its answer dropped.
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(call));
                }
            })?;
        Ok(LowPriorityThread {
            name: name.to_owned(),
            calls,
        })
    }

    pub(crate) async fn run<T: Send + 'static>(
        &self,
        call: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, ServiceError> {
        let (answer, answered) = tokio::sync::oneshot::channel();
        self.calls
            .send(Box::new(move || {
                let _ = answer.send(call());
            }))
            .map_err(|_| ServiceError::Internal(format!("the thread {} has stopped", self.name)))?;
        answered.await.map_err(|_| {
            ServiceError::Internal(format!("a call on the thread {} panicked", self.name))
        })
    }
}

/// Sets the calling thread's nice value (Linux keeps one per thread). Elsewhere it does
/// nothing: there the value belongs to the whole process.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn lower_this_threads_priority(nice: i32) -> std::io::Result<()> {
    // SAFETY: both calls take and return plain integers and touch no memory of ours.
    let tid = unsafe { libc::gettid() };
    let id = libc::id_t::try_from(tid).map_err(std::io::Error::other)?;
    // SAFETY: as above.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, id, nice) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(not(target_os = "linux"))]
fn lower_this_threads_priority(_nice: i32) -> std::io::Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const NICE: i32 = 10;

    /// The calling thread's nice value, as the kernel reports it.
    #[cfg(target_os = "linux")]
    fn this_threads_nice() -> i32 {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
        // Fields after the command's closing parenthesis start at the 3rd; nice is the 19th.
        let after = stat.rsplit_once(')').unwrap().1;
        after.split_whitespace().nth(16).unwrap().parse().unwrap()
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn calls_run_on_the_named_thread_at_its_nice_value() {
        let steps = LowPriorityThread::start("belfry-test-steps", NICE).unwrap();
        let here = this_threads_nice();
        let (name, nice) = steps
            .run(|| {
                let name = std::thread::current().name().map(str::to_owned);
                (name, this_threads_nice())
            })
            .await
            .unwrap();
        assert_eq!(name.as_deref(), Some("belfry-test-steps"));
        assert_eq!(nice, NICE);
        // Only that thread: the caller's priority is unchanged.
        assert_eq!(this_threads_nice(), here);
    }

    #[tokio::test]
    async fn a_call_that_panics_is_an_error_and_the_next_call_still_runs() {
        let steps = LowPriorityThread::start("belfry-test-steps", NICE).unwrap();
        let panicked = steps.run(|| -> u32 { panic!("a call failed") }).await;
        assert!(
            matches!(&panicked, Err(ServiceError::Internal(m)) if m.contains("panicked")),
            "{panicked:?}"
        );
        assert_eq!(steps.run(|| 7).await.unwrap(), 7);
    }
}
