//! The role a column plays in a job table, as `#[field(..)]` names it.

/// The role a column plays in a job table, as `#[field(..)]` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// `id`: the row id.
    Id,
    /// `group`: the group (queue name) a row waits in.
    Group,
    /// `attempt`: the delivery count.
    Attempt,
    /// `retry_after`: when the row is due.
    RetryAfter,
    /// `locked_until`: until when a claim holds the row.
    LockedUntil,
    /// `payload`: the job's payload.
    Payload,
    /// `enqueued_at`: when the row was published.
    EnqueuedAt,
    /// `last_error`: the last failed attempt's error.
    LastError,
    /// `headers`: the job's headers as JSON text.
    Headers,
    /// `priority`: the job's priority, `-2..=2`.
    Priority,
}

impl Role {
    /// Every role, in the order of the messages (and of `Table`'s fields).
    pub(crate) const ALL: [Role; 10] = [
        Role::Id,
        Role::Group,
        Role::Attempt,
        Role::RetryAfter,
        Role::LockedUntil,
        Role::Payload,
        Role::EnqueuedAt,
        Role::LastError,
        Role::Headers,
        Role::Priority,
    ];

    /// The role as written in `#[field(..)]`, which is also the name of `Table`'s field.
    pub(crate) const fn name(self) -> &'static str {
        match self {
            Role::Id => "id",
            Role::Group => "group",
            Role::Attempt => "attempt",
            Role::RetryAfter => "retry_after",
            Role::LockedUntil => "locked_until",
            Role::Payload => "payload",
            Role::EnqueuedAt => "enqueued_at",
            Role::LastError => "last_error",
            Role::Headers => "headers",
            Role::Priority => "priority",
        }
    }

    /// The role written `name`, if any.
    pub(crate) fn from_name(name: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.name() == name)
    }

    /// The trait of `stagedoor_jobs::inbox::roles` that the field's type must implement.
    pub(crate) const fn type_trait(self) -> &'static str {
        match self {
            Role::Id => "IdType",
            Role::Group => "GroupType",
            Role::Attempt => "AttemptType",
            Role::RetryAfter | Role::LockedUntil | Role::EnqueuedAt => "TimeType",
            Role::Payload => "PayloadType",
            Role::LastError | Role::Headers => "TextType",
            Role::Priority => "PriorityType",
        }
    }

    /// Whether the database may fill the column on insert (`#[field(.., generated)]`).
    pub(crate) const fn may_be_generated(self) -> bool {
        matches!(self, Role::Id | Role::Attempt)
    }

    /// Whether `Table` holds the column as an `Option` (the role is optional).
    pub(crate) const fn optional(self) -> bool {
        !matches!(self, Role::Id | Role::Payload)
    }
}
