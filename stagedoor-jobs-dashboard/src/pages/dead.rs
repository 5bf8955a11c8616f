//! The dead letters: the list of dead letters, one dead letter's jobs (filter by kind and by
//! text in the error, paging), one job, and the actions (replay or purge one, the selected, a
//! kind, all), each through a confirmation page that says how many jobs it takes, then a POST,
//! then a page with the result. One file each: `list.rs`, `letter.rs` (and `payload.rs`, a
//! payload for reading), `confirm.rs`, `action.rs`; `request.rs` reads what an action names
//! and checks it is a dead letter, `links.rs` makes the links between them.

mod action;
mod confirm;
mod letter;
mod links;
mod list;
mod payload;
mod request;

pub(crate) use action::action;
pub(crate) use confirm::confirm;
pub(crate) use letter::{download, letter};
pub(crate) use list::list;
