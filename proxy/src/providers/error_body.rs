//! Reading an upstream error body, whatever its shape: the message is kept word for
//! word; each adapter classifies it by its own wire's types and codes.

use serde_json::Value;

/// The longest raw (non-JSON) upstream body quoted as a message.
const MAX_RAW_MESSAGE: usize = 2048;

/// What an upstream error body says.
pub(super) struct Said {
    /// Never empty: a body that says nothing gets one naming the status.
    pub message: String,
    /// `error.type` (or a top-level `type` other than `error`).
    pub kind: Option<String>,
    /// `error.code`, a number rendered as text.
    pub code: Option<String>,
}

pub(super) fn read(status: u16, body: &[u8]) -> Said {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let err = &v["error"];
    let s = |x: &Value| x.as_str().map(str::to_owned);
    let message = s(&err["message"])
        .or_else(|| s(err)) // {"error": "text"}
        .or_else(|| s(&v["message"])) // vLLM: {"object":"error","message":...}
        .or_else(|| s(&v["detail"])) // FastAPI
        .unwrap_or_else(|| {
            let text = String::from_utf8_lossy(body);
            let text = text.trim();
            let mut end = text.len().min(MAX_RAW_MESSAGE);
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text[..end].to_owned()
        });
    let code = match &err["code"] {
        Value::String(c) => Some(c.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    };
    Said {
        message: if message.is_empty() {
            format!("the upstream answered {status}")
        } else {
            message
        },
        kind: s(&err["type"]).or_else(|| s(&v["type"]).filter(|t| t != "error")),
        code,
    }
}
