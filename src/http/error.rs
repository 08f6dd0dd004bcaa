//! The HTTP layer's error type and the one place where every failure becomes the API's error answer
//! (docs/api.md § Errors): `{"error": {"code", "message", "field"?}}` with the matching status.
//!
//! Internal failures are logged here with their context and leave the server as a bare `internal_error`.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use caisse_engine::{EngineError, Rejection};
use serde::Serialize;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub field: Option<String>,
    /// Seconds, for 429 and 503.
    pub retry_after_s: Option<u64>,
}

/// `Retry-After` of a 503 `unavailable`: a merchant moving between the nodes of a cluster is served again
/// within a second or two, a dead node's within 15 s, a database restarting within seconds; a client that
/// waits this long and retries (with the same `Idempotency-Key`) neither hammers the service nor waits for
/// nothing.
pub const UNAVAILABLE_RETRY_AFTER_S: u64 = 2;

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, code, message: message.into(), field: None, retry_after_s: None }
    }

    pub fn with_field(mut self, field: impl Into<String>) -> ApiError {
        self.field = Some(field.into());
        self
    }

    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", message).with_field(field)
    }

    pub fn invalid_json(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_json", message)
    }

    pub fn not_found(what: &str) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", format!("{what} not found"))
    }

    pub fn unauthorized(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }

    pub fn unavailable() -> ApiError {
        ApiError::unavailable_saying("the service cannot store changes right now; retry later")
    }

    /// 503 `unavailable` with `Retry-After`, saying `message`.
    pub fn unavailable_saying(message: impl Into<String>) -> ApiError {
        ApiError {
            retry_after_s: Some(UNAVAILABLE_RETRY_AFTER_S),
            ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
        }
    }

    /// An unexpected failure: logged with its context, answered without details.
    pub fn internal(context: &str, detail: impl std::fmt::Display) -> ApiError {
        tracing::error!(context, error = %detail, "internal error");
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal_error", "internal error")
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.status.as_u16(), self.code, self.message)
    }
}

/// Every non-2xx answer.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = ErrorBody)]
pub struct Body<'a> {
    error: Inner<'a>,
}

/// The body of every error answer, as the API document names it.
pub type ErrorBody<'a> = Body<'a>;

#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = ErrorDetail)]
pub struct Inner<'a> {
    code: &'a str,
    message: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    field: Option<&'a str>,
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        self.status
    }

    fn error_response(&self) -> HttpResponse {
        let mut response = HttpResponse::build(self.status);
        if let Some(seconds) = self.retry_after_s {
            response.insert_header(("Retry-After", seconds.to_string()));
        }
        response.json(Body { error: Inner { code: self.code, message: &self.message, field: self.field.as_deref() } })
    }
}

impl From<EngineError> for ApiError {
    fn from(err: EngineError) -> ApiError {
        let conflict = |code, message: String| ApiError::new(StatusCode::CONFLICT, code, message);
        match err {
            EngineError::Rejected(rejection) => match rejection {
                Rejection::NotFound => ApiError::not_found("payment or payout"),
                Rejection::DuplicateReference => {
                    conflict("duplicate_reference", rejection.to_string()).with_field("reference")
                }
                Rejection::InvalidState(_) | Rejection::LinkClosed(_) => {
                    conflict("invalid_state", rejection.to_string())
                }
                Rejection::InsufficientBalance { .. } => conflict("insufficient_balance", rejection.to_string()),
                Rejection::AmountBelowFee { .. } | Rejection::RefundAboveAmount { .. } | Rejection::Money(_) => {
                    ApiError::invalid("montant", rejection.to_string())
                }
                Rejection::Invariant(detail) => ApiError::internal("ledger invariant", detail),
                Rejection::Impossible(what) => ApiError::internal("impossible state", what),
            },
            EngineError::IdempotencyKeyReused => conflict(
                "idempotency_key_reused",
                "this Idempotency-Key was already used with a different request".into(),
            ),
            EngineError::IdempotencyKeyInUse => {
                conflict("idempotency_key_in_use", "a request with this Idempotency-Key is still in progress".into())
            }
            EngineError::Unavailable(detail) => {
                tracing::warn!(error = %detail, "engine unavailable");
                ApiError::unavailable()
            }
            EngineError::Retired => ApiError::unavailable(),
            EngineError::OutcomeUnknown(detail) => {
                tracing::warn!(error = %detail, "a forwarded change was not answered in time");
                ApiError::unavailable_saying(
                    "the change was not confirmed in time and may have been made: retry with the same \
                     Idempotency-Key to learn its outcome",
                )
            }
            EngineError::EmailTaken(_) => {
                ApiError::new(StatusCode::CONFLICT, "duplicate_email", "a merchant with this e-mail already exists")
                    .with_field("email")
            }
            EngineError::Internal(detail) | EngineError::IncompatibleStore(detail) => {
                ApiError::internal("engine", detail)
            }
        }
    }
}

impl From<caisse_engine::store::StoreError> for ApiError {
    fn from(err: caisse_engine::store::StoreError) -> ApiError {
        ApiError::from(EngineError::from(err))
    }
}

#[cfg(test)]
mod tests {
    use caisse_engine::domain::ledger::LedgerError;
    use caisse_engine::store::StoreError;

    use super::*;

    /// A state the rules make impossible is a bug: answered 500 `internal_error` without details, never a 404
    /// that would tell a merchant their payment does not exist.
    #[test]
    fn impossible_states_and_broken_invariants_are_internal_errors_not_not_found() {
        let bugs = [
            Rejection::impossible("a payment rule leads to another kind's status"),
            Rejection::Invariant(LedgerError::Unbalanced { sum_minor: 1 }),
        ];
        for rejection in bugs {
            assert!(rejection.is_bug());
            let answer = ApiError::from(EngineError::Rejected(rejection));
            assert_eq!(
                (answer.status.as_u16(), answer.code, answer.message.as_str()),
                (500, "internal_error", "internal error")
            );
        }
        let corrupt = ApiError::from(StoreError::Corrupt("journal jumps from 3 to 5".into()));
        assert_eq!((corrupt.status.as_u16(), corrupt.code), (500, "internal_error"));
        let missing = ApiError::from(EngineError::Rejected(Rejection::NotFound));
        assert!(!Rejection::NotFound.is_bug());
        assert_eq!(missing.status.as_u16(), 404);
    }

    /// Every 503 `unavailable` tells the client when to retry; a change forwarded to its merchant's node and not
    /// answered in time says that it may have been made, so that the retry carries the same key.
    #[test]
    fn unavailable_answers_carry_retry_after_and_an_unanswered_change_says_it_may_have_been_made() {
        let answers = [
            ApiError::from(StoreError::Io("disk full".into())),
            ApiError::from(EngineError::Retired),
            ApiError::from(EngineError::Unavailable("the merchant is moving between nodes".into())),
            ApiError::from(EngineError::OutcomeUnknown("no answer in 15 s".into())),
        ];
        for answer in &answers {
            assert_eq!((answer.status.as_u16(), answer.code), (503, "unavailable"));
            let response = answer.error_response();
            assert_eq!(
                response.headers().get("retry-after").and_then(|v| v.to_str().ok()),
                Some(UNAVAILABLE_RETRY_AFTER_S.to_string().as_str())
            );
        }
        assert!(!answers[2].message.contains("Idempotency-Key"), "{}", answers[2].message);
        assert!(answers[3].message.contains("may have been made"), "{}", answers[3].message);
        assert!(answers[3].message.contains("Idempotency-Key"), "{}", answers[3].message);
    }
}
