//! The `aqw keys` subcommands' arguments (clap's derive types), apart from
//! `args.rs` so that file stays under the size limit.

use super::purge::PurgeArgs;
use clap::{Subcommand, ValueEnum};

/// Which keys `keys list` shows.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KeyStatusFilter {
    /// Claimed, not finished (running, or its attempt ended without a verdict).
    Pending,
    /// The effect happened.
    Done,
    /// The job was poisoned; a replay runs it.
    Poisoned,
    /// Closed by an operator: a delivery is a duplicate.
    Cancelled,
}

#[derive(Subcommand)]
pub enum KeysCmd {
    /// List a function's keys (every page), oldest change first within each
    /// key-hash partition; filtered by the service.
    #[command(
        after_help = "Cost: one query over the keys table, one request per 1,000 rows the service scans (the\nfilters run on the service; the table holds every function's keys of this account).\n\nExit codes: 0 listed (none is not an error), 1 some listed key is pending or poisoned, 2 bad arguments, 3 storage error.\n\nExamples:\n  aqw keys list GrantCredit --prefix credits:acct-7: --status poisoned\n  aqw keys list GrantCredit --since 02:00:00 --output json"
    )]
    List {
        /// The function whose keys to list.
        function: String,
        /// Keys starting with this text.
        #[arg(long)]
        prefix: Option<String>,
        /// Keys in this state only.
        #[arg(long, value_enum)]
        status: Option<KeyStatusFilter>,
        /// Changed at or after: RFC 3339 time or a duration ago (hh:mm:ss).
        #[arg(long)]
        since: Option<String>,
        /// Changed before: RFC 3339 time or a duration ago (hh:mm:ss).
        #[arg(long)]
        until: Option<String>,
        /// At most this many (default: all).
        #[arg(long)]
        limit: Option<usize>,
    },
    /// Ask the provider (the function's handler.lookup) whether the key's
    /// provider key took effect: applied, not applied or unknown.
    #[command(
        after_help = "Exit codes: 0 the provider answered (applied or not applied), 1 unknown, not asked (no handler.lookup) or the key was never claimed, 2 bad arguments, 3 storage error.\n\nExample:\n  aqw keys check SendReceipt receipt:o-1"
    )]
    Check {
        /// The function the key belongs to.
        function: String,
        /// The full key, as `poison list` or `poison show` prints it.
        key: String,
    },
    /// Give a key a new provider key, for a provider that replays a saved
    /// failure under the old one (replayed_failure). Only once the provider
    /// confirms the old key took no effect: a retry under a new key is a new
    /// request to it. Kept in the key's history with who and why.
    #[command(
        after_help = "Exit codes: 0 replaced (or, with --dry-run, would be), 1 refused (never claimed, done, or held by a running attempt), 2 bad arguments, 3 storage error.\n\nExamples:\n  aqw keys new-provider-key SendReceipt receipt:o-1 --reason \"ledger support: no charge\" --dry-run\n  aqw keys new-provider-key SendReceipt receipt:o-1 --reason \"ledger support: no charge under the old key (ticket 4411)\""
    )]
    NewProviderKey {
        /// The function the key belongs to.
        function: String,
        /// The full key.
        key: String,
        /// Why, with the provider's confirmation (kept in the history).
        #[arg(long)]
        reason: String,
        /// Who is doing it (default: $USER; needed).
        #[arg(long, env = "USER")]
        by: String,
        /// Show what would change (the key, its state, the provider key
        /// that would be replaced); change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Show the idempotency record of one key.
    #[command(
        after_help = "Exit codes: 0 shown, 1 the key was never claimed (no record), 2 bad arguments, 3 storage error.\n\nExample:\n  aqw keys show SendReceipt receipt:o-1"
    )]
    Show {
        /// The function the key belongs to.
        function: String,
        /// The full key, as `poison list` or `poison show` prints it.
        key: String,
    },
    /// Delete settled keys (done, cancelled) older than the keys retention;
    /// pending and poisoned keys, and keys of open poison records, are kept.
    #[command(
        after_help = "Exit codes: 0 purged (or counted), 2 bad arguments or an --older-than below the safety floor, 3 storage error.\n\nExamples:\n  aqw keys purge --dry-run\n  aqw keys purge --function SendReceipt --older-than 30.00:00:00 --output json"
    )]
    Purge(PurgeArgs),
}
