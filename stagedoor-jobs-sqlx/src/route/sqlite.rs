//! What SQLite does its own way: opening the database file (WAL, `synchronous = NORMAL`), and
//! waking only this process's workers on publish (no `NOTIFY`).

use std::time::Duration;

use stagedoor_jobs::{BrokerError, Inbox};

use super::SqlxRoute;
use crate::broker::Source;

impl<Row: Inbox> SqlxRoute<sqlx::Sqlite, Row> {
    pub(crate) async fn notify_in(
        &self,
        _conn: &mut sqlx::SqliteConnection,
        _queue: &str,
    ) -> Result<(), BrokerError> {
        self.broker.wake_all();
        Ok(())
    }

    pub(crate) async fn open(&self) -> Result<(), BrokerError> {
        use std::str::FromStr;
        let shared = &self.broker.shared;
        shared
            .pool
            .get_or_try_init(|| async {
                match self.broker.take_source() {
                    Some(Source::Pool(p)) => Ok(p),
                    Some(Source::Url(url, options)) => {
                        let opts = sqlx::sqlite::SqliteConnectOptions::from_str(&url)
                            .map_err(|e| BrokerError::Connection(format!(
                                "`{}` is not an SQLite URL ({e}): write sqlite://path/to/file.db",
                                shared.url_for_messages
                            )))?
                            .create_if_missing(true)
                            .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
                            .synchronous(sqlx::sqlite::SqliteSynchronous::Normal)
                            .busy_timeout(Duration::from_secs(10));
                        options.connect_with(opts).await.map_err(|e| BrokerError::Connection(format!(
                            "cannot open the SQLite database `{}`: {e}: check the path and that its folder exists",
                            shared.url_for_messages
                        )))
                    }
                    None => Err(BrokerError::Connection("the broker's connection failed earlier; restart the service".to_owned())),
                }
            })
            .await?;
        Ok(())
    }
}
