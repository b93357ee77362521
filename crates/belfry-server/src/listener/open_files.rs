//! The process's open-files limit against the connection cap.
//!
//! Every connection is a file descriptor. Many systems start a service with a soft limit of
//! 1,024 descriptors (and a hard limit far above it), so a server that keeps the soft limit
//! runs out of descriptors long before `http.connections_max` (10,000 by default), and the cap
//! never applies: accepting then fails and pauses instead (`accept a connection` in the log).
//! `belfry serve` raises the soft limit to the hard one at start, as raising it needs no
//! privilege, and warns when even the hard limit cannot hold the cap.

/// Descriptors the server needs besides its HTTP clients' connections: the store's files,
/// Redis and broker connections, webhook connections.
pub const FILES_BESIDES_CONNECTIONS: u64 = 2_048;

/// The open-files limits of this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFiles {
    /// The soft limit before [`raise_soft_limit`].
    pub before: u64,
    /// The soft limit now.
    pub soft: u64,
    pub hard: u64,
}

impl OpenFiles {
    /// What to tell the operator when the soft limit cannot hold `connections_max` served
    /// connections, `waiting_max` accepted at the cap (`http.listen_backlog`) and
    /// [`FILES_BESIDES_CONNECTIONS`]; None when it can.
    pub fn shortfall(&self, connections_max: usize, waiting_max: usize) -> Option<String> {
        let needed = (connections_max + waiting_max) as u64 + FILES_BESIDES_CONNECTIONS;
        (self.soft < needed).then(|| {
            let clients = self.soft.saturating_sub(FILES_BESIDES_CONNECTIONS);
            let past = if clients == 0 {
                "even the first clients may find accepting failing and pausing".to_owned()
            } else {
                format!("past about {clients} clients, accepting fails and pauses")
            };
            format!(
                "the open-files limit is {} (hard limit {}), below http.connections_max \
                 ({connections_max}) plus http.listen_backlog ({waiting_max}) connections \
                 waiting at the cap plus {FILES_BESIDES_CONNECTIONS} for files and outgoing \
                 connections: {past} instead of the cap applying. Raise the limit \
                 (`ulimit -n {needed}`, or LimitNOFILE={needed} in a systemd unit) or lower \
                 http.connections_max",
                self.soft, self.hard,
            )
        })
    }
}

/// Raises this process's soft open-files limit to its hard limit (children started afterwards
/// inherit it).
pub fn raise_soft_limit() -> std::io::Result<OpenFiles> {
    let (before, hard) = rlimit::getrlimit(rlimit::Resource::NOFILE)?;
    if before < hard {
        rlimit::setrlimit(rlimit::Resource::NOFILE, hard, hard)?;
    }
    Ok(OpenFiles {
        before,
        soft: before.max(hard),
        hard,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_below_the_cap_and_its_spare_is_a_shortfall_that_says_what_to_do() {
        let files = |soft| OpenFiles {
            before: 1_024,
            soft,
            hard: soft,
        };
        assert_eq!(files(13_072).shortfall(10_000, 1_024), None);
        let told = files(13_071)
            .shortfall(10_000, 1_024)
            .expect("one descriptor short");
        assert!(told.contains("http.connections_max (10000)"), "{told}");
        assert!(told.contains("http.listen_backlog (1024)"), "{told}");
        assert!(told.contains("ulimit -n 13072"), "{told}");
        assert!(told.contains("LimitNOFILE=13072"), "{told}");
        assert!(told.contains("past about 11023 clients"), "{told}");
        let tiny = files(100).shortfall(10, 1).expect("short");
        assert!(tiny.contains("even the first clients"), "{tiny}");
    }

    #[test]
    fn raising_leaves_the_soft_limit_at_the_hard_one() {
        let files = raise_soft_limit().expect("getrlimit and setrlimit");
        assert_eq!(files.soft, files.hard);
        assert!(files.before <= files.soft);
        assert_eq!(
            raise_soft_limit().unwrap().before,
            files.hard,
            "raised already"
        );
    }
}
