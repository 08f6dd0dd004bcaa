//! The dashboard as a browser sees it, over HTTP: an agent that keeps cookies like a browser and never
//! follows redirects (so each test sees them), and the pages it gets back. Shared by the dashboard and hostile
//! suites (`#[path]`), on top of the shared harness's server.

// The hostile suite includes this file too and uses only part of it.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::time::Duration;

use crate::support::TestApp;

impl TestApp {
    pub fn agent(&self) -> Agent {
        Agent::new(&self.address)
    }

    /// An agent logged in as the demo merchant.
    pub async fn logged_in(&self) -> Agent {
        let mut agent = self.agent();
        let page = agent.login(self.email(), self.password()).await;
        assert_eq!(page.status, 303, "login: {}", page.body);
        agent
    }
}

/// An answer of the dashboard, read whole.
#[derive(Debug)]
pub struct Page {
    pub status: u16,
    pub location: Option<String>,
    pub set_cookies: Vec<String>,
    pub content_type: String,
    pub headers: actix_web::http::header::HeaderMap,
    pub body: String,
}

impl Page {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The CSRF token of the page's forms.
    pub fn csrf(&self) -> String {
        hidden(&self.body, "csrf").unwrap_or_else(|| panic!("no csrf field in: {}", self.body))
    }

    #[track_caller]
    pub fn expect(&self, status: u16) -> &Page {
        assert_eq!(self.status, status, "unexpected status; body: {}", self.body);
        self
    }

    #[track_caller]
    pub fn expect_redirect(&self, to: &str) -> &Page {
        assert_eq!(self.status, 303, "expected a redirect to {to}; body: {}", self.body);
        assert_eq!(self.location.as_deref(), Some(to));
        self
    }

    #[track_caller]
    pub fn contains(&self, text: &str) -> &Page {
        assert!(self.body.contains(text), "`{text}` not in page:\n{}", self.body);
        self
    }
}

/// The value of the hidden field `name` in an HTML page.
pub fn hidden(html: &str, name: &str) -> Option<String> {
    let marker = format!("name=\"{name}\" value=\"");
    let start = html.find(&marker)? + marker.len();
    let end = html[start..].find('"')?;
    Some(html[start..start + end].to_owned())
}

/// An HTTP client that keeps cookies like a browser and does not follow redirects.
pub struct Agent {
    client: awc::Client,
    base: String,
    pub cookies: BTreeMap<String, String>,
    /// Sent as `X-Forwarded-For` when set, as a reverse proxy in front of the server would.
    pub forwarded_for: Option<String>,
}

impl Agent {
    pub fn new(base: &str) -> Agent {
        let client = awc::Client::builder().disable_redirects().timeout(Duration::from_secs(10)).finish();
        Agent { client, base: base.to_owned(), cookies: BTreeMap::new(), forwarded_for: None }
    }

    /// An agent whose connections leave from `local` (another loopback address, `127.0.0.2`): another client
    /// address for the server.
    pub fn from_address(base: &str, local: std::net::IpAddr) -> Agent {
        let connector = awc::Connector::new().local_address(local);
        let client =
            awc::Client::builder().connector(connector).disable_redirects().timeout(Duration::from_secs(10)).finish();
        Agent { client, base: base.to_owned(), cookies: BTreeMap::new(), forwarded_for: None }
    }

    pub async fn get(&mut self, path: &str) -> Page {
        let request = self.client.get(format!("{}{}", self.base, path));
        self.send(request, None).await
    }

    /// Posts a form (`application/x-www-form-urlencoded`).
    pub async fn post(&mut self, path: &str, fields: &[(&str, &str)]) -> Page {
        let request = self.client.post(format!("{}{}", self.base, path));
        let body = serde_urlencoded::to_string(fields).expect("form");
        self.send(request, Some(body)).await
    }

    async fn send(&mut self, mut request: awc::ClientRequest, form: Option<String>) -> Page {
        if let Some(client) = &self.forwarded_for {
            request = request.insert_header(("X-Forwarded-For", client.as_str()));
        }
        if !self.cookies.is_empty() {
            let header: Vec<String> = self.cookies.iter().map(|(k, v)| format!("{k}={v}")).collect();
            request = request.insert_header(("Cookie", header.join("; ")));
        }
        let mut response = match form {
            Some(body) => {
                request.insert_header(("Content-Type", "application/x-www-form-urlencoded")).send_body(body).await
            }
            None => request.send().await,
        }
        .expect("dashboard answers");
        let set_cookies: Vec<String> =
            response.headers().get_all("set-cookie").filter_map(|v| v.to_str().ok()).map(str::to_owned).collect();
        for cookie in &set_cookies {
            let pair = cookie.split(';').next().unwrap_or("");
            if let Some((name, value)) = pair.split_once('=') {
                if value.is_empty() || cookie.contains("Max-Age=0") {
                    self.cookies.remove(name);
                } else {
                    self.cookies.insert(name.to_owned(), value.to_owned());
                }
            }
        }
        let header = |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let location = header("location");
        let content_type = header("content-type").unwrap_or_default();
        let headers = response.headers().clone();
        let body = response.body().limit(4 << 20).await.expect("page body");
        Page {
            status: response.status().as_u16(),
            location,
            set_cookies,
            content_type,
            headers,
            body: String::from_utf8_lossy(&body).into_owned(),
        }
    }

    /// Fetches the login form and posts it; a refused form (a locked address) is the answer itself.
    pub async fn login(&mut self, email: &str, password: &str) -> Page {
        let form = self.get("/login").await;
        if form.status != 200 {
            return form;
        }
        let token = form.csrf();
        self.post("/login", &[("csrf", &token), ("email", email), ("password", password)]).await
    }
}
