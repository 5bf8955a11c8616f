//! What Postgres does its own way: connecting (one direct connection first, to report a wrong
//! URL at once), `NOTIFY` on publish, the `LISTEN` connection that wakes idle workers, and
//! counting the rows a statement changed.

use std::time::Duration;

use chrono::{DateTime, Utc};
use stagedoor_jobs::BrokerError;
use stagedoor_jobs::inbox::Table;

use super::sealed::Sealed;
use super::{PG_ACQUIRE_WAIT, db_err};
use crate::broker::{Source, SqlxBroker};
use crate::sql::{CHANNEL, Flavor};

impl Sealed for sqlx::Postgres {
    const FLAVOR: Flavor = Flavor::Postgres;

    async fn notify<'c>(
        broker: &'c SqlxBroker<Self>,
        conn: &'c mut sqlx::PgConnection,
        queue: &'c str,
    ) -> Result<(), BrokerError> {
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(CHANNEL)
            .bind(queue)
            .execute(&mut *conn)
            .await
            .map_err(db_err)?;
        broker.wake_all();
        Ok(())
    }

    fn rows_affected(done: &sqlx::postgres::PgQueryResult) -> u64 {
        done.rows_affected()
    }

    const LOCKS_FIFO_GROUPS: bool = true;

    /// A transaction-scoped advisory lock on the hash of `key`.
    async fn lock_fifo_group(
        conn: &mut sqlx::PgConnection,
        key: String,
    ) -> Result<(), BrokerError> {
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
            .bind(key)
            .execute(&mut *conn)
            .await
            .map_err(db_err)?;
        Ok(())
    }

    /// `now()`: with autocommit, the statement's time.
    async fn database_time(conn: &mut sqlx::PgConnection) -> Result<DateTime<Utc>, BrokerError> {
        sqlx::query_scalar::<_, DateTime<Utc>>("SELECT now()")
            .fetch_one(&mut *conn)
            .await
            .map_err(db_err)
    }

    async fn reuses_ids<'c>(_conn: &'c mut sqlx::PgConnection, _table: &'c Table) -> Option<bool> {
        Some(false)
    }

    async fn open(broker: &SqlxBroker<Self>) -> Result<(), BrokerError> {
        let shared = &broker.shared;
        let pool = shared
            .pool
            .get_or_try_init(|| async {
                match broker.take_source() {
                    Some(Source::Pool(p)) => Ok(p),
                    Some(Source::Url(url, options)) => {
                        use std::str::FromStr;
                        let masked = &shared.url_for_messages;
                        let opts = sqlx::postgres::PgConnectOptions::from_str(&url).map_err(|e| {
                            BrokerError::Connection(format!(
                                "`{masked}` is not a Postgres URL ({e}): write postgres://user:password@host:port/database"
                            ))
                        })?;
                        // One direct connection first: a refused port, an unknown host or a
                        // wrong password is reported at once with its cause (the pool would
                        // retry a refused connection until its acquire timeout, 30 s, and then
                        // say only "pool timed out").
                        let fix = "check the URL (postgres://user:password@host:port/database) and that the server is running and accepts connections there";
                        match tokio::time::timeout(PG_CONNECT_WAIT, <sqlx::PgConnection as sqlx::Connection>::connect_with(&opts)).await {
                            Ok(Ok(conn)) => {
                                let _ = sqlx::Connection::close(conn).await;
                            }
                            Ok(Err(e)) => {
                                return Err(BrokerError::Connection(format!(
                                    "cannot connect to Postgres at `{masked}`: {e}: {fix}"
                                )));
                            }
                            Err(_) => {
                                return Err(BrokerError::Connection(format!(
                                    "cannot connect to Postgres at `{masked}`: no answer within {PG_CONNECT_WAIT:?}: {fix}"
                                )));
                            }
                        }
                        options.connect_with(opts).await.map_err(|e| {
                            BrokerError::Connection(format!(
                                "cannot connect to Postgres at `{masked}`: {e}: {fix}"
                            ))
                        })
                    }
                    None => Err(BrokerError::Connection("the broker's connection failed earlier; restart the service".to_owned())),
                }
            })
            .await?
            .clone();
        if !shared
            .listening
            .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            let broker = broker.clone();
            // Restarted after a panic; it returns when the pool closes.
            tokio::spawn(stagedoor_jobs::supervise::restart_on_panic(
                "postgres LISTEN",
                move || listen(broker.clone(), pool.clone()),
            ));
        }
        Ok(())
    }
}

/// How long the first connection to Postgres may take at start before it is reported.
const PG_CONNECT_WAIT: Duration = Duration::from_secs(5);

/// Wakes this process's idle workers on every `NOTIFY`. The `LISTEN` holds a connection of its
/// own, outside `pool` (same connect options): a pool of one connection still publishes and
/// claims. Reconnects after an outage (backoff up to 1 s; workers poll meanwhile); returns when
/// `pool` closes.
async fn listen(broker: SqlxBroker<sqlx::Postgres>, pool: sqlx::PgPool) {
    let own = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .min_connections(0)
        .max_lifetime(None)
        .idle_timeout(None)
        .acquire_timeout(PG_ACQUIRE_WAIT)
        .connect_lazy_with((*pool.connect_options()).clone());
    let closed = pool.close_event();
    tokio::pin!(closed);
    let mut wait = Duration::from_millis(100);
    let mut failures: u32 = 0;
    loop {
        match sqlx::postgres::PgListener::connect_with(&own).await {
            Ok(mut l) => {
                if let Err(e) = l.listen(CHANNEL).await {
                    tracing::warn!(error = %e, "LISTEN failed; polling meanwhile");
                } else {
                    if failures > 0 {
                        tracing::info!("the LISTEN connection is back");
                    }
                    wait = Duration::from_millis(100);
                    failures = 0;
                    // Notifications sent while it was away are lost: look now.
                    broker.wake_all();
                    loop {
                        tokio::select! {
                            got = l.recv() => match got {
                                Ok(_) => broker.wake_all(),
                                Err(e) => {
                                    tracing::warn!(error = %e, "the LISTEN connection broke; reconnecting (workers poll meanwhile)");
                                    break;
                                }
                            },
                            _ = &mut closed => {
                                own.close().await;
                                return;
                            }
                        }
                    }
                }
            }
            Err(e) => {
                failures += 1;
                if failures == 1 || failures.is_multiple_of(20) {
                    tracing::warn!(error = %e, "cannot open the LISTEN connection ({failures} tries); polling meanwhile");
                }
            }
        }
        if pool.is_closed() {
            own.close().await;
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = &mut closed => {
                own.close().await;
                return;
            }
        }
        wait = (wait * 2).min(Duration::from_secs(1));
    }
}
