//! `InboxQueue<Row>`: the typed queue descriptor of a group of a job table.

use std::fmt;
use std::marker::PhantomData;

use stagedoor_jobs::{Inbox, QueueDescriptor, QueueFor};

use crate::route::SqlxRoute;

/// A group (queue) of the job table of `Row`: `#[subscriber(InboxQueue::<SendMail>::new("emails"))]`.
///
/// A subscriber on it can only be mounted on a route of the same row type
/// (`broker.route::<SendMail>(..)`): mounting it on another table or backend does not compile.
pub struct InboxQueue<Row> {
    group: String,
    _row: PhantomData<fn() -> Row>,
}

impl<Row> InboxQueue<Row> {
    /// The group `group` of `Row`'s table.
    pub fn new(group: impl Into<String>) -> Self {
        Self {
            group: group.into(),
            _row: PhantomData,
        }
    }
}

impl<Row> fmt::Debug for InboxQueue<Row> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InboxQueue")
            .field("row", &std::any::type_name::<Row>())
            .field("group", &self.group)
            .finish()
    }
}

impl<Row: Inbox> QueueDescriptor for InboxQueue<Row> {
    fn queue_name(&self) -> String {
        self.group.clone()
    }
    fn backend(&self) -> Option<&'static str> {
        Some("sqlx")
    }
}

impl<DB: sqlx::Database, Row: Inbox> QueueFor<SqlxRoute<DB, Row>> for InboxQueue<Row> where
    SqlxRoute<DB, Row>: stagedoor_jobs::Broker
{
}
