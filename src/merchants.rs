//! Merchant accounts: creation (secret key, password hash, webhook URL), shared by `caisse merchant create`,
//! the first-start demo merchant and the tests.

use argon2::password_hash::rand_core::OsRng;
use argon2::password_hash::{PasswordHasher, SaltString};
use argon2::Argon2;
use caisse_engine::domain::ids::{random_base62, MerchantId};
use caisse_engine::domain::records::Merchant;
use caisse_engine::domain::text::Email;
use caisse_engine::domain::time::Timestamp;
use caisse_engine::{Engine, EngineError};

use crate::config::Environment;
use caisse_engine::webhook::url::{UrlError, WebhookUrl};

/// What `merchant create` asks for.
#[derive(Debug, Clone)]
pub struct NewMerchant {
    pub name: String,
    pub email: String,
    pub password: Option<String>,
    pub webhook_url: Option<String>,
}

/// A created merchant with its password in clear, to be shown once.
#[derive(Debug, Clone)]
pub struct Created {
    pub merchant: Merchant,
    pub password: String,
}

#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    #[error("--name must be 1 to 200 characters")]
    Name,
    #[error("--email: {0}")]
    Email(String),
    #[error("--password must be 8 to 128 characters")]
    Password,
    #[error("--webhook-url: {0}")]
    WebhookUrl(#[from] UrlError),
    #[error("could not hash the password: {0}")]
    Hash(String),
    #[error(transparent)]
    Engine(#[from] EngineError),
}

pub fn new_secret_key(env: Environment) -> String {
    format!("{}{}", env.key_prefix(), random_base62(32))
}

pub fn hash_password(password: &str) -> Result<String, CreateError> {
    let salt = SaltString::generate(&mut OsRng);
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| CreateError::Hash(e.to_string()))
}

/// A new merchant account, checked and with its password hashed and its secret key drawn, not yet stored.
pub fn prepare(env: Environment, new: NewMerchant) -> Result<Created, CreateError> {
    let name = new.name.trim().to_owned();
    if name.is_empty() || name.chars().count() > 200 {
        return Err(CreateError::Name);
    }
    let email = Email::parse(&new.email).map_err(|e| CreateError::Email(e.to_string()))?;
    let password = new.password.unwrap_or_else(|| random_base62(16));
    if !(8..=128).contains(&password.chars().count()) {
        return Err(CreateError::Password);
    }
    let webhook_url = new.webhook_url.map(|u| WebhookUrl::parse(&u, env == Environment::Production)).transpose()?;
    let merchant = Merchant {
        id: MerchantId::new(),
        name,
        email: email.as_str().to_owned(),
        password_hash: hash_password(&password)?,
        secret_key: new_secret_key(env),
        webhook_url: webhook_url.map(|u| u.as_str().to_owned()),
        created_at: Timestamp::now(),
    };
    Ok(Created { merchant, password })
}

/// Creates the merchant through the engine and answers once it is durable.
pub async fn create(engine: &Engine, env: Environment, new: NewMerchant) -> Result<Created, CreateError> {
    let created = prepare(env, new)?;
    engine.put_merchant(created.merchant.clone(), None).await?;
    Ok(created)
}
