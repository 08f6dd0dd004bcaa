//! Checks that many tests share: the contract's error answer and list shape, and small readers of JSON that
//! fail with the value they were given.

use serde_json::Value;

use super::api::Resp;

#[track_caller]
pub fn int(v: &Value) -> i64 {
    v.as_i64().unwrap_or_else(|| panic!("not an integer: {v}"))
}

#[track_caller]
pub fn text(v: &Value) -> &str {
    v.as_str().unwrap_or_else(|| panic!("not a string: {v}"))
}

/// The `reference` of a payment (or of anything that has one).
#[track_caller]
pub fn reference_of(record: &Value) -> String {
    text(&record["reference"]).to_owned()
}

/// Asserts the contract's error answer: status, code, `field` (or its absence), and a body that is exactly
/// `{"error": {"code", "message"[, "field"]}}`.
#[track_caller]
pub fn assert_error(resp: &Resp, status: u16, code: &str, field: Option<&str>) {
    let shown = String::from_utf8_lossy(&resp.body);
    assert_eq!(resp.status, status, "status; body: {shown}");
    let ct = resp.header("content-type").unwrap_or("");
    assert!(ct.starts_with("application/json"), "errors are JSON, got content-type `{ct}`");
    let top = resp.json.as_object().unwrap_or_else(|| panic!("error body is not a JSON object: {shown}"));
    assert_eq!(top.keys().collect::<Vec<_>>(), vec!["error"], "only `error` at the top: {shown}");
    let error = top["error"].as_object().unwrap_or_else(|| panic!("`error` is not an object: {shown}"));
    let mut keys: Vec<&str> = error.keys().map(String::as_str).collect();
    keys.sort_unstable();
    let expected: Vec<&str> = if field.is_some() { vec!["code", "field", "message"] } else { vec!["code", "message"] };
    assert_eq!(keys, expected, "error keys: {shown}");
    assert_eq!(error["code"], code, "code: {shown}");
    let message = error["message"].as_str().unwrap_or_else(|| panic!("message is not a string: {shown}"));
    assert!(!message.is_empty(), "empty message: {shown}");
    if let Some(f) = field {
        assert_eq!(error["field"], f, "field: {shown}");
    }
}

/// Asserts `{"data": [...], "has_more", "next_cursor"}` with `next_cursor` null exactly when `has_more` is false.
#[track_caller]
pub fn assert_list_shape(page: &Value) {
    let obj = page.as_object().unwrap_or_else(|| panic!("list is not an object: {page}"));
    let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["data", "has_more", "next_cursor"], "{page}");
    assert!(page["data"].is_array(), "{page}");
    let has_more = page["has_more"].as_bool().unwrap_or_else(|| panic!("has_more not a bool: {page}"));
    assert_eq!(page["next_cursor"].is_null(), !has_more, "next_cursor null exactly when has_more is false: {page}");
    if has_more {
        assert!(page["next_cursor"].is_string(), "{page}");
    }
}

/// The `data` of a list answer, checked for shape.
#[track_caller]
pub fn data(page: &Value) -> Vec<Value> {
    assert_list_shape(page);
    page["data"].as_array().expect("data").clone()
}

/// The values of `field` in a list's items.
pub fn field_values(items: &[Value], field: &str) -> Vec<String> {
    items.iter().map(|i| i[field].as_str().map(str::to_owned).unwrap_or_else(|| i[field].to_string())).collect()
}
