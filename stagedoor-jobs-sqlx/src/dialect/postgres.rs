//! What Postgres does its own way: connecting (one direct connection first, to report a wrong
//! URL at once), `NOTIFY` on publish, the `LISTEN` connection that wakes idle workers, and
//! counting the rows a statement changed.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::Row as _;
use stagedoor_jobs::BrokerError;
use stagedoor_jobs::inbox::Table;

use super::sealed::Sealed;
use super::{PG_ACQUIRE_WAIT, db_err};
use crate::broker::{Source, SqlxBroker};
use crate::catalog::{Found, Layout};
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

    /// The layout of `table` from the catalog (no columns when there is no such table).
    async fn layout(pool: &sqlx::PgPool, table: &Table) -> Result<Layout, sqlx::Error> {
        // `to_regclass` resolves the name as the statements do (the search path, or the
        // schema given); NULL, and no rows, when there is no such table.
        let rows = sqlx::query(
            "SELECT CAST(a.attname AS TEXT) AS name, \
                    format_type(a.atttypid, a.atttypmod) AS declared, \
                    CAST(CASE WHEN t.typtype = 'd' THEN b.typname ELSE t.typname END AS TEXT) AS base, \
                    a.attnotnull AS not_null, \
                    (a.atthasdef OR a.attidentity <> '') AS has_default \
             FROM pg_catalog.pg_attribute a \
             JOIN pg_catalog.pg_type t ON t.oid = a.atttypid \
             LEFT JOIN pg_catalog.pg_type b ON b.oid = t.typbasetype \
             WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped \
             ORDER BY a.attnum",
        )
        .bind(table.qualified())
        .fetch_all(pool)
        .await?;
        let columns = rows
            .iter()
            .map(|r| {
                Ok(Found {
                    name: r.try_get("name")?,
                    declared: r.try_get("declared")?,
                    base: r
                        .try_get::<Option<String>, _>("base")?
                        .unwrap_or_default()
                        .to_ascii_lowercase(),
                    not_null: r.try_get("not_null")?,
                    has_default: r.try_get("has_default")?,
                    pk: 0,
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()?;
        Ok(Layout {
            columns,
            rowid: false,
        })
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

    /// A `timestamptz` read from its stored microseconds: sqlx's own conversion panics on
    /// `infinity`.
    fn stored_time(row: &sqlx::postgres::PgRow, i: usize) -> Option<Result<DateTime<Utc>, String>> {
        use sqlx::{Row as _, TypeInfo as _, ValueRef as _};
        let raw = row.try_get_raw(i).ok()?;
        if raw.is_null() || raw.type_info().name() != "TIMESTAMPTZ" {
            return None;
        }
        let micros = row.try_get_unchecked::<i64, _>(i).ok();
        Some(micros.and_then(pg_time).ok_or_else(|| {
            match micros {
                Some(i64::MAX) => "'infinity'",
                Some(i64::MIN) => "'-infinity'",
                _ => "a timestamp out of range",
            }
            .to_owned()
        }))
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
                                // The listener holds `own`'s one connection: `close` waits for it.
                                drop(l);
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

/// A Postgres `timestamptz` as stored (microseconds since 2000-01-01 UTC), if chrono can hold
/// it: `infinity`, `-infinity` and the years beyond chrono's range cannot.
fn pg_time(micros: i64) -> Option<DateTime<Utc>> {
    const PG_EPOCH: i64 = 946_684_800;
    let secs = PG_EPOCH.checked_add(micros.div_euclid(1_000_000))?;
    let nanos = u32::try_from(micros.rem_euclid(1_000_000))
        .ok()?
        .checked_mul(1_000)?;
    DateTime::from_timestamp(secs, nanos)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgres_timestamps_outside_chrono_are_none_not_a_panic() {
        assert_eq!(pg_time(i64::MAX), None, "infinity");
        assert_eq!(pg_time(i64::MIN), None, "-infinity");
        assert_eq!(
            pg_time(0).map(|t| t.to_rfc3339()),
            Some("2000-01-01T00:00:00+00:00".to_owned())
        );
        assert_eq!(
            pg_time(-1).map(|t| t.to_rfc3339()),
            Some("1999-12-31T23:59:59.999999+00:00".to_owned())
        );
    }
}
