//! `GET /v1/transactions` and `GET /v1/transactions/{reference}` (docs/api.md § Transactions), and the paging rules
//! every list shares.

use std::collections::BTreeMap;

use actix_web::{web, HttpRequest, HttpResponse};
use caisse_engine::core::Record;
use caisse_engine::domain::ids::{validate_id, IdKind};
use caisse_engine::domain::money::Currency;
use caisse_engine::domain::records::{Transaction, TransactionType};
use caisse_engine::domain::status::{PaymentStatus, PayoutStatus, RefundStatus};
use caisse_engine::domain::time::Timestamp;
use caisse_engine::store::Page;
use serde::Serialize;

use super::error::{ApiError, ErrorBody};
use super::extract::{authenticate, parse_query};
use super::AppState;

pub const DEFAULT_LIMIT: usize = 20;
pub const MAX_LIMIT: usize = 100;

/// A list answer: `{"data", "has_more", "next_cursor"}`, `next_cursor` null exactly when `has_more` is false.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Listed<T> {
    data: Vec<T>,
    has_more: bool,
    next_cursor: Option<String>,
}

impl<T> From<Page<T>> for Listed<T> {
    fn from(page: Page<T>) -> Listed<T> {
        let next_cursor = if page.has_more { page.next_cursor } else { None };
        Listed { data: page.data, has_more: next_cursor.is_some(), next_cursor }
    }
}

impl<T> Listed<T> {
    /// A page the store was asked `limit + 1` items for. The store's own `has_more` only says that its index
    /// goes on, whether or not anything further matches the filters; the extra item, when it came, says that
    /// another matching item exists. The cursor is then the last item shown (`cursor_of`).
    pub fn one_more(mut page: Page<T>, limit: usize, cursor_of: impl Fn(&T) -> String) -> Listed<T> {
        if page.data.len() > limit {
            page.data.truncate(limit);
            let next_cursor = page.data.last().map(cursor_of);
            return Listed { data: page.data, has_more: next_cursor.is_some(), next_cursor };
        }
        Listed::from(page)
    }
}

/// `limit` (1–100, default 20) and `starting_after` (an id of the kind this list returns).
pub fn page_params(query: &BTreeMap<String, String>, cursor_kind: IdKind) -> Result<(usize, Option<String>), ApiError> {
    let limit = match query.get("limit") {
        None => DEFAULT_LIMIT,
        Some(text) => match text.parse::<usize>() {
            Ok(n) if (1..=MAX_LIMIT).contains(&n) => n,
            _ => return Err(ApiError::invalid("limit", format!("a whole number from 1 to {MAX_LIMIT}"))),
        },
    };
    let cursor = query.get("starting_after").cloned();
    if let Some(c) = &cursor {
        validate_id(cursor_kind, c).map_err(|_| ApiError::invalid("starting_after", "not a cursor of this list"))?;
    }
    Ok((limit, cursor))
}

fn timestamp(query: &BTreeMap<String, String>, field: &str) -> Result<Option<Timestamp>, ApiError> {
    query
        .get(field)
        .map(|t| Timestamp::parse_rfc3339(t).map_err(|e| ApiError::invalid(field, e.to_string())))
        .transpose()
}

/// List transactions (payments, refunds, payouts), newest first.
#[utoipa::path(get, path = "/v1/transactions", tag = "transactions",
    params(("limit" = Option<u32>, Query, description = "1-100, default 20"),
        ("starting_after" = Option<String>, Query, description = "next_cursor of the previous page"),
        ("type" = Option<TransactionType>, Query), ("statut" = Option<String>, Query),
        ("devise" = Option<String>, Query), ("fournisseur" = Option<String>, Query),
        ("created_from" = Option<String>, Query, description = "RFC 3339"),
        ("created_to" = Option<String>, Query, description = "RFC 3339")),
    responses((status = 200, description = "A page of transactions", body = Listed<Transaction>), (status = 400, description = "Invalid input", body = ErrorBody), (status = 401, description = "Missing, unknown or wrong-environment key", body = ErrorBody), (status = 429, description = "Rate limited", body = ErrorBody), (status = 503, description = "Storage unavailable", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list(state: web::Data<AppState>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let merchant = authenticate(&state, req.headers())?;
    let allowed = ["limit", "starting_after", "type", "statut", "devise", "fournisseur", "created_from", "created_to"];
    let query = parse_query(&req, &allowed)?;
    let (limit, cursor) = page_params(&query, IdKind::Transaction)?;
    let kind = query
        .get("type")
        .map(|t| {
            TransactionType::parse(t)
                .ok_or_else(|| ApiError::invalid("type", "one of paiement, remboursement, retrait"))
        })
        .transpose()?;
    let status = query.get("statut").cloned();
    if let Some(s) = &status {
        let known =
            PaymentStatus::parse(s).is_some() || RefundStatus::parse(s).is_some() || PayoutStatus::parse(s).is_some();
        if !known {
            return Err(ApiError::invalid("statut", format!("`{s}` is not a status")));
        }
    }
    let currency = query
        .get("devise")
        .map(|d| Currency::parse(d).map_err(|e| ApiError::invalid("devise", e.to_string())))
        .transpose()?;
    let provider = query.get("fournisseur").cloned();
    if let Some(f) = &provider {
        if state.providers.get(f).is_none() {
            return Err(ApiError::invalid("fournisseur", format!("unknown provider `{f}`")));
        }
    }
    let from = timestamp(&query, "created_from")?;
    let to = timestamp(&query, "created_to")?;
    let page = state.engine.transactions(&merchant.id, cursor.as_deref(), limit + 1, &mut |tx: &Transaction| {
        kind.is_none_or(|k| tx.kind == k)
            && status.as_deref().is_none_or(|s| tx.status == s)
            && currency.is_none_or(|d| tx.currency == d)
            && provider.as_deref().is_none_or(|f| tx.provider.as_str() == f)
            && from.is_none_or(|f| tx.created_at >= f)
            && to.is_none_or(|t| tx.created_at <= t)
    })?;
    Ok(HttpResponse::Ok().json(Listed::one_more(page, limit, |tx| tx.transaction_id.clone())))
}

/// Retrieve a transaction by payment reference, refund reference, payout id or transaction id.
#[utoipa::path(get, path = "/v1/transactions/{reference}", tag = "transactions",
    params(("reference" = String, Path)),
    responses((status = 200, description = "The transaction", body = Transaction), (status = 400, description = "Invalid input", body = ErrorBody), (status = 401, description = "Missing, unknown or wrong-environment key", body = ErrorBody), (status = 429, description = "Rate limited", body = ErrorBody), (status = 503, description = "Storage unavailable", body = ErrorBody),
        (status = 404, description = "Unknown reference", body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn get(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let merchant = authenticate(&state, req.headers())?;
    // A reference first (a merchant may choose one that starts with `tx_`), then one of our `tx_` ids, which
    // must be this merchant's: another merchant's id is not found, like an unknown one.
    let located = match state.engine.locate(&merchant.id, &path)? {
        Some(located) => Some(located),
        None if path.starts_with("tx_") => state
            .engine
            .owner_of_transaction(&path)?
            .filter(|(owner, _)| *owner == merchant.id)
            .map(|(_, located)| located),
        None => None,
    };
    let located = located.ok_or_else(|| ApiError::not_found("transaction"))?;
    let tx = match (&located.record, located.kind) {
        (Record::Payout(o), _) => Transaction::of_payout(o),
        (Record::Payment(p), TransactionType::Refund) => match p.refund_named(&located.reference) {
            Some(r) => Transaction::of_refund(p, r),
            None => return Err(ApiError::not_found("transaction")),
        },
        (Record::Payment(p), _) => Transaction::of_payment(p),
        (Record::Link(_), _) => return Err(ApiError::not_found("transaction")),
    };
    Ok(HttpResponse::Ok().json(tx))
}
