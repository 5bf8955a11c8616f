//! What the fixture does to the backend behind the broker's back: hand edits (junk) and a
//! server restart, with the calls made while it is down.

use std::time::Duration;

use super::Exec;
use super::state::{Failed, QUEUE, St, call, fail};
use crate::broker::{Broker, Inspect, Publish};
use crate::conformance::fixture::{Fixture, Junk, Outage};
use crate::envelope::Priority;

/// How long a call made while the server is down may take to fail.
const OUTAGE_LIMIT: Duration = Duration::from_secs(10);
/// How long the broker may take to answer again once the server is back (a worker retries
/// its calls meanwhile; so does the model).
const RECOVERY_LIMIT: Duration = Duration::from_secs(5);

impl<F: Fixture> Exec<'_, F> {
    pub(super) async fn junk(&mut self, pick: usize, id: &str) -> Result<(), Failed> {
        let kinds = self.fixture.junk_kinds();
        if kinds.is_empty() {
            self.ran.skipped += 1;
            return Ok(());
        }
        let kind = kinds[pick % kinds.len()];
        if kind == Junk::WrongTypeKey
            && self
                .jobs
                .iter()
                .any(|j| j.st.alive() && self.at_blocked_level.contains(&j.id))
        {
            // The edit would delete a live job by hand (a SET over its stream): not the
            // machinery's loss to find.
            self.ran.skipped += 1;
            return Ok(());
        }
        call(
            "store_junk",
            self.fixture.store_junk(&self.broker, QUEUE, kind, id),
        )
        .await?
        .map_err(|e| {
            fail(
                "fixture",
                format!("the fixture could not store {kind:?}: {e}"),
            )
        })?;
        if kind != Junk::WrongTypeKey {
            self.junk_stored += 1;
            return Ok(());
        }
        // A job published at the blocked level while the bad key is there, then again
        // once it is repaired.
        let good = id.replacen("junk-", "w", 1);
        let level = Junk::WRONG_TYPE_LEVEL;
        self.at_blocked_level.insert(good.clone());
        let first = call(
            "publish",
            self.broker
                .publish_job(Self::job(&good, Duration::ZERO, level)),
        )
        .await?;
        call(
            "repair_junk",
            self.fixture.repair_junk(&self.broker, QUEUE, kind),
        )
        .await?;
        match first {
            Ok(p) => {
                Self::check_new(&good, "publish over a key of the wrong type", &p)?;
                self.add_job(&good, St::Ready, None, 0);
                Ok(())
            }
            Err(e) => self.publish_again(&good, level, &e.to_string()).await,
        }
    }

    /// The server goes away for `down` (or its connections are cut) and comes back: calls made
    /// meanwhile fail (bounded by [`OUTAGE_LIMIT`]), the same broker answers again within
    /// [`RECOVERY_LIMIT`], the queue holds what the model has, and the publish that failed
    /// meanwhile stores its job when retried. Held deliveries stay held (their settlement is
    /// checked as any other's: it takes effect, or is fenced once the lease may have lapsed),
    /// and no job is delivered again while a lease of it is live (checked at each claim).
    pub(super) async fn restart(&mut self, id: &str, down: Duration) -> Result<(), Failed> {
        let Some(gone) = call("server_down", self.fixture.server_down(&self.broker)).await? else {
            self.ran.skipped += 1;
            return Ok(());
        };
        let outage = gone.map_err(|e| {
            fail(
                "fixture",
                format!("the fixture could not take the server down: {e}"),
            )
        })?;
        let meanwhile = match outage {
            Outage::Down => self.while_down(id).await,
            _ => Ok(false),
        };
        self.pass(down).await;
        // The server comes back even when a call failed a check meanwhile, so that the
        // shrinker's next run finds it.
        call("server_up", self.fixture.server_up(&self.broker))
            .await?
            .map_err(|e| {
                fail(
                    "fixture",
                    format!("the fixture could not bring the server back: {e}"),
                )
            })?;
        let published_meanwhile = meanwhile?;
        let back = self.now();
        self.restarted = Some(back);
        self.ran.restarts += 1;
        loop {
            let last = match call("stats", self.broker.stats(QUEUE)).await? {
                Ok(_) => break,
                Err(e) => e.to_string(),
            };
            if self.now() > back + RECOVERY_LIMIT {
                return Err(fail(
                    "not recovered",
                    format!(
                        "the broker did not answer within {RECOVERY_LIMIT:?} of the server's return ({outage:?}); last error: {last}"
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.ran.slowest_recovery = self.ran.slowest_recovery.max(self.now() - back);
        if published_meanwhile {
            self.publish_again(id, Priority::NORMAL, "the server was down")
                .await?;
        }
        self.stats().await
    }

    /// Calls made while the server is down: a claim and a publish of `id` must each fail
    /// within [`OUTAGE_LIMIT`]. Returns whether the publish was made (it stored nothing).
    pub(super) async fn while_down(&mut self, id: &str) -> Result<bool, Failed> {
        let hung = |what: &str| {
            fail(
                "hung while down",
                format!(
                    "{what} made while the server was down did not return within {OUTAGE_LIMIT:?}"
                ),
            )
        };
        let claimed = tokio::time::timeout(
            OUTAGE_LIMIT,
            self.broker.claim(
                QUEUE,
                1,
                Duration::ZERO,
                crate::broker::ClaimOrder::Priority,
            ),
        )
        .await
        .map_err(|_| hung("a claim"))?;
        if let Ok(d) = claimed {
            return Err(fail(
                "answered while down",
                format!(
                    "a claim made while the server was down answered {} deliveries instead of an error",
                    d.len()
                ),
            ));
        }
        if self.skip.iter().any(|s| s == "publish") {
            return Ok(false);
        }
        let published = tokio::time::timeout(
            OUTAGE_LIMIT,
            self.broker
                .publish_job(Self::job(id, Duration::ZERO, Priority::NORMAL)),
        )
        .await
        .map_err(|_| hung("a publish"))?;
        if let Ok(p) = published {
            return Err(fail(
                "answered while down",
                format!("a publish of {id} made while the server was down answered {p:?}"),
            ));
        }
        Ok(true)
    }
}
