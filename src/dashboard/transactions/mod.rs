//! `GET /transactions` (filters by type, statut, devise, fournisseur and creation dates; pages of [`super::PAGE_SIZE`]
//! following a cursor) and `GET /transactions/{reference}`, the detail of a payment, refund or payout with its history
//! and its webhook deliveries.
//!
//! The history is the merchant's journal filtered by reference. The journal is ordered by position, not by reference,
//! so reading it whole would grow with the merchant's age: instead a binary search over positions (the journal's times
//! only grow, one actor writes them) finds the first event at the record's creation, and at most
//! [`history::HISTORY_SCAN`] events from there are read. A change made after that many other events of the same
//! merchant is not shown, and the page says so.
//!
//! `list` holds the list page with its filters, `detail` the detail page with the summaries it shows, and
//! `history` the bounded search of the journal.

mod detail;
mod history;
mod list;

pub use detail::detail;
pub use list::{date, list};
