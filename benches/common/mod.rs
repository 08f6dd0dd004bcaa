//! What the benches share: the payment each of their payment lives starts with, and the size of a store's
//! directory.

use caisse_engine::core::NewPayment;
use caisse_engine::domain::money::{Amount, Currency, FeeRule};
use caisse_engine::domain::phone::Phone;
use caisse_engine::domain::records::ProviderCode;
use caisse_engine::domain::text::Metadata;

/// 10,000 XOF by MTN MoMo at a 1.5 % fee, without a merchant reference.
pub fn new_payment() -> NewPayment {
    NewPayment {
        reference: None,
        amount: Amount::positive(10_000).expect("amount"),
        currency: Currency::parse("XOF").expect("currency"),
        provider: ProviderCode::parse("mtn_momo").expect("provider"),
        fee: FeeRule::new(150, Amount::ZERO).expect("fee"),
        customer_phone: Phone::parse("+22997000055").expect("phone"),
        customer_email: None,
        customer_name: None,
        description: None,
        metadata: Metadata::empty(),
        link: None,
    }
}

/// Bytes of every file under `dir`.
#[allow(dead_code)]
pub fn dir_bytes(dir: &std::path::Path) -> u64 {
    let mut total = 0;
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            match entry.metadata() {
                Ok(m) if m.is_dir() => pending.push(entry.path()),
                Ok(m) => total += m.len(),
                Err(_) => {}
            }
        }
    }
    total
}
