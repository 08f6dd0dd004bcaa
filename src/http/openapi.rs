//! `GET /v1/openapi.json`: the OpenAPI 3 document of the API, generated from the handlers' annotations and
//! the very types they serialize, so it cannot drift from the code. A test checks that its operations are
//! exactly [`super::ROUTES`].

use actix_web::HttpResponse;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::{fournisseurs, liens, paiement, retraits, soldes, transactions, utility};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Caisse API",
        description = "Payment collection and payout service. Amounts are integers in the currency's smallest \
                       unit; authentication is `Authorization: Bearer <secret key>` except on /v1/ping."
    ),
    paths(
        paiement::initiate,
        paiement::get,
        paiement::refund,
        transactions::list,
        transactions::get,
        soldes::get,
        retraits::create,
        retraits::list,
        retraits::get,
        liens::create,
        liens::list,
        liens::get,
        liens::deactivate,
        utility::ping,
        utility::currencies,
        utility::providers,
        fournisseurs::notification,
        fournisseurs::adapter_notification,
        fournisseurs::adapter_notification_with_token,
        fournisseurs::adapter_notification_put,
        fournisseurs::adapter_ping,
        fournisseurs::adapter_ping_with_token,
        document,
    ),
    modifiers(&BearerAuth, &Suspended)
)]
pub struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme("bearer", SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)));
    }
}

/// Every operation a merchant's key opens may also answer 403 `merchant_suspended`.
struct Suspended;

impl Modify for Suspended {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        for item in openapi.paths.paths.values_mut() {
            let operations = [&mut item.get, &mut item.post, &mut item.put, &mut item.delete, &mut item.patch];
            for operation in operations.into_iter().flatten() {
                // Provider notices answer 401 too, but carry no merchant key.
                if operation.security.as_ref().is_none_or(|s| s.is_empty()) {
                    continue;
                }
                let responses = &mut operation.responses.responses;
                let Some(utoipa::openapi::RefOr::T(unauthorized)) = responses.get("401").cloned() else { continue };
                let mut suspended = unauthorized;
                suspended.description = "merchant_suspended: the operator suspended this merchant".into();
                responses.entry("403".into()).or_insert(utoipa::openapi::RefOr::T(suspended));
            }
        }
    }
}

/// This document. Served without authentication: it describes the API and holds no merchant data.
#[utoipa::path(get, path = "/v1/openapi.json", tag = "utility",
    responses((status = 200, description = "The OpenAPI document", body = Object)))]
pub async fn document() -> HttpResponse {
    HttpResponse::Ok().json(ApiDoc::openapi())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use actix_web::{test as web_test, App};

    use super::*;
    use crate::http::{configure, ROUTES};

    fn routes() -> BTreeSet<(String, String)> {
        ROUTES.iter().map(|(m, p)| (m.to_string(), p.to_string())).collect()
    }

    #[test]
    fn the_document_has_every_route_and_nothing_else() {
        let doc = ApiDoc::openapi();
        let mut documented = BTreeSet::new();
        for (path, item) in &doc.paths.paths {
            let methods = [
                ("GET", item.get.is_some()),
                ("POST", item.post.is_some()),
                ("PUT", item.put.is_some()),
                ("PATCH", item.patch.is_some()),
                ("DELETE", item.delete.is_some()),
            ];
            for (method, present) in methods {
                if present {
                    documented.insert((method.to_string(), path.clone()));
                }
            }
        }
        assert_eq!(documented, routes());
    }

    #[actix_web::test]
    async fn every_listed_route_is_served() {
        let app = web_test::init_service(App::new().configure(configure)).await;
        for (method, path) in ROUTES {
            let uri = path.replace("{reference}", "ref-1").replace("{id}", "ret_1").replace("{code}", "wave");
            let req = web_test::TestRequest::default().method(method.parse().unwrap()).uri(&uri).to_request();
            let body = web_test::call_and_read_body(&app, req).await;
            let text = String::from_utf8_lossy(&body);
            assert!(!text.contains("no endpoint"), "{method} {path} is not routed: {text}");
        }
        let req = web_test::TestRequest::get().uri("/v1/nothing").to_request();
        let body = web_test::call_and_read_body(&app, req).await;
        assert!(String::from_utf8_lossy(&body).contains("no endpoint"));
    }
}
