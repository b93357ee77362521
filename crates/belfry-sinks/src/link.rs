//! A stream sink's connection, shared by its deliveries: made when a delivery first needs it
//! (concurrent deliveries wait for one connect instead of each opening their own), dropped
//! after a failure that may have broken it, and made again by the next delivery.

use std::future::Future;
use std::sync::{Mutex, MutexGuard, PoisonError};

pub(crate) struct SharedLink<T> {
    /// A plain mutex, held only to clone or replace the handle, so the hot path never waits
    /// on an async lock.
    slot: Mutex<Option<T>>,
    /// Held while connecting.
    connecting: tokio::sync::Mutex<()>,
}

impl<T> Default for SharedLink<T> {
    fn default() -> Self {
        SharedLink {
            slot: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
        }
    }
}

impl<T: Clone> SharedLink<T> {
    /// The current connection, or one made by `connect`. Whoever connects stores the
    /// connection for the others; a failed connect stores nothing.
    pub async fn get_or_connect<E, F>(&self, connect: impl FnOnce() -> F) -> Result<T, E>
    where
        F: Future<Output = Result<T, E>>,
    {
        if let Some(link) = self.slot().clone() {
            return Ok(link);
        }
        let _connecting = self.connecting.lock().await;
        // Another delivery may have connected while this one waited.
        if let Some(link) = self.slot().clone() {
            return Ok(link);
        }
        let link = connect().await?;
        *self.slot() = Some(link.clone());
        Ok(link)
    }

    /// Drops the connection (the next delivery makes a new one) and answers it, if any.
    pub fn forget(&self) -> Option<T> {
        self.slot().take()
    }

    fn slot(&self) -> MutexGuard<'_, Option<T>> {
        // The value is only replaced whole, so a panic while holding the lock cannot leave
        // it half-updated: a poisoned lock is simply taken over.
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[tokio::test]
    async fn concurrent_deliveries_share_one_connect_and_a_forgotten_link_is_made_again() {
        let link = Arc::new(SharedLink::<usize>::default());
        let connects = Arc::new(AtomicUsize::new(0));
        let (release, wait) = tokio::sync::watch::channel(false);
        let mut deliveries = Vec::new();
        for _ in 0..8 {
            let (link, connects, mut wait) = (link.clone(), connects.clone(), wait.clone());
            deliveries.push(tokio::spawn(async move {
                link.get_or_connect(|| async move {
                    // Held open until every delivery is waiting on this connect.
                    let _ = wait.wait_for(|open| *open).await;
                    Ok::<_, ()>(connects.fetch_add(1, Ordering::SeqCst) + 1)
                })
                .await
            }));
        }
        tokio::task::yield_now().await;
        release.send(true).expect("receivers alive");
        for delivery in deliveries {
            assert_eq!(delivery.await.expect("joined"), Ok(1));
        }
        assert_eq!(connects.load(Ordering::SeqCst), 1);

        assert_eq!(link.forget(), Some(1));
        assert_eq!(link.forget(), None);
        let failed = link.get_or_connect(|| async { Err::<usize, _>("refused") });
        assert_eq!(failed.await, Err("refused"));
        let again = link.get_or_connect(|| async { Ok::<_, &str>(2) });
        assert_eq!(again.await, Ok(2));
        assert_eq!(
            link.get_or_connect(|| async { Ok::<_, &str>(3) }).await,
            Ok(2)
        );
    }
}
