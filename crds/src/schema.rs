//! Schema fragments shared by the resources: the Gateway API duration form, the
//! decimal price form, enum lists kept as plain strings, namespace and route
//! references, and condition lists.
//!
//! Enum-like fields are `String`s in the raw types (the schema carries the `enum`) so
//! that a standalone manifest with a bad value gets a diagnostic naming the field from
//! `compile` instead of a serde error that takes the whole file down.

use schemars::generate::SchemaGenerator;
use schemars::{Schema, json_schema};

/// Gateway API duration: up to four `<number><unit>` pairs, units `h`, `m`, `s`, `ms`.
pub const DURATION_PATTERN: &str = "^([0-9]{1,5}(h|m|s|ms)){1,4}$";
/// A non-negative decimal with up to 9 digits either side of the point.
pub const DECIMAL_PATTERN: &str = r"^[0-9]{1,9}(\.[0-9]{1,9})?$";

/// Upper bounds on string and list sizes. Besides rejecting nonsense, they keep the
/// CEL rules' estimated cost within the API server's budget.
pub const MAX_NAME_LEN: u32 = 253;
pub const MAX_MODEL_LEN: u32 = 256;
pub const MAX_MODELS: u32 = 32;
pub const MAX_TARGETS: u32 = 8;
pub const MAX_STATUS_CODES: u32 = 32;
pub const MAX_HEADERS: u32 = 32;
pub const MAX_HEADER_VALUE_LEN: u32 = 4096;
pub const MAX_URL_LEN: u32 = 2048;
/// Namespaces a route may list in `sharedWith`, and routes a client may list.
pub const MAX_SHARED_WITH: u32 = 64;
pub const MAX_CLIENT_ROUTES: u32 = 64;
/// A namespace name: an RFC 1123 label, at most 63 characters.
pub const MAX_NAMESPACE_LEN: u32 = 63;
/// `sharedWith` entries: a namespace name, or `*` for every namespace.
pub const SHARED_WITH_PATTERN: &str = r"^(\*|[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)$";
/// `LLMClient.spec.routes` entries: `name` (the client's namespace) or `namespace/name`;
/// route names are RFC 1123 subdomains like every object name.
pub const ROUTE_REF_PATTERN: &str = r"^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?/)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
pub const MAX_ROUTE_REF_LEN: u32 = MAX_NAMESPACE_LEN + 1 + MAX_NAME_LEN;

/// Ranges of an LLMClient's limits and budgets. Generous upper bounds: they exist to
/// catch a misplaced digit and to keep per-replica arithmetic far from overflow.
pub const MAX_REQUESTS_PER_MINUTE: i32 = 1_000_000;
pub const MAX_TOKENS_PER_MINUTE: i32 = 1_000_000_000;
pub const MAX_CLIENT_CONCURRENCY: i32 = 100_000;
pub const MAX_TOKENS_PER_DAY: i64 = 1_000_000_000_000;
/// `budget.defaultReservation`: tokens a request without an output cap reserves. The
/// largest output of today's models is ~128k tokens; a million catches a misplaced digit.
pub const MAX_DEFAULT_RESERVATION: i64 = 1_000_000;
/// `budget.defaultReservation` when unset.
pub const DEFAULT_RESERVATION: u64 = 1_000;

pub const MODES: [&str; 4] = ["fallback", "loadbalance", "least-latency", "cost-optimized"];
pub const PROVIDERS: [&str; 7] = [
    "openai",
    "anthropic",
    "openai-compatible",
    "azure-openai",
    "gemini",
    "vertex",
    "bedrock",
];
/// `apiVersion` of an azure-openai credential: `v1`, or a dated (preview) version.
pub const API_VERSION_PATTERN: &str = r"^(v1|[0-9]{4}-[0-9]{2}-[0-9]{2}(-preview)?)$";
pub const FAILURE_CLASSES: [&str; 8] = [
    "status5xx",
    "rateLimited",
    "timeout",
    "connectionError",
    "contextLength",
    "invalidResponse",
    "authError",
    "contentFilter",
];

/// `spec.stream.resume.mode`.
pub const RESUME_MODES: [&str; 2] = ["Off", "Continue"];

/// A size: decimal bytes, or a number with a binary suffix (`Ki`, `Mi`).
pub const BYTE_SIZE_PATTERN: &str = "^[0-9]{1,9}(Ki|Mi)?$";
/// `spec.stream.resume.maxHeldBytes`: from 1Ki to 16Mi.
pub const MIN_HELD_BYTES: u64 = 1024;
pub const MAX_HELD_BYTES: u64 = 16 * 1024 * 1024;
/// The same range in CEL, for an int-or-string: `string(self)` is the text of either
/// form, which `quantity` reads.
pub const BYTE_SIZE_RANGE_RULE: &str = "quantity(string(self)).compareTo(quantity('1Ki')) >= 0 && quantity(string(self)).compareTo(quantity('16Mi')) <= 0";

/// No `default`: an absent mode is Off, and a CRD default of `Off` would be read as
/// `false` by a YAML 1.1 reader such as kubectl.
pub(crate) fn resume_mode(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "enum": RESUME_MODES,
    })
}

/// An int-or-string size (the form of Kubernetes quantities), its string form
/// limited to a plain or `Ki`/`Mi` number.
pub(crate) fn byte_size(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "x-kubernetes-int-or-string": true,
        "pattern": BYTE_SIZE_PATTERN,
    })
}

pub(crate) fn duration(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "maxLength": 32,
        "pattern": DURATION_PATTERN,
    })
}

/// Most keys in a credential's pool (`secretRef.keys`).
pub const MAX_POOL_KEYS: u32 = 32;
/// A Secret data key name (Kubernetes' own rule).
pub const SECRET_KEY_PATTERN: &str = r"^[-._a-zA-Z0-9]+$";

/// `secretRef.keys`: 1 to 32 Secret data key names.
pub(crate) fn key_pool(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "minItems": 1,
        "maxItems": MAX_POOL_KEYS,
        "items": { "type": "string", "minLength": 1, "maxLength": MAX_NAME_LEN, "pattern": SECRET_KEY_PATTERN },
    })
}

/// A key's state in a credential's status (docs/request-lifecycle.md#key-pools).
pub(crate) fn key_state(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "enum": crate::stats::KeyState::ALL.map(|s| s.as_str()),
    })
}

/// `spec.responseModel`.
pub(crate) fn response_model(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "enum": RESPONSE_MODELS,
    })
}

pub const RESPONSE_MODELS: [&str; 2] = ["requested", "served"];

/// A target's state in status (docs/troubleshooting.md#target-states).
pub(crate) fn target_state(_: &mut SchemaGenerator) -> Schema {
    let states: Vec<&str> = crate::stats::TargetState::ALL
        .iter()
        .map(|s| s.as_str())
        .collect();
    json_schema!({
        "type": "string",
        "enum": states,
    })
}

pub(crate) fn decimal(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "maxLength": 19,
        "pattern": DECIMAL_PATTERN,
    })
}

pub(crate) fn mode(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "enum": MODES,
        "default": "fallback",
    })
}

pub(crate) fn provider(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "enum": PROVIDERS,
    })
}

pub(crate) fn api_version(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "maxLength": 32,
        "pattern": API_VERSION_PATTERN,
    })
}

/// `modelMap`: client model name to upstream model, at most 32 entries.
pub(crate) fn model_map(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "minProperties": 1,
        "maxProperties": MAX_MODELS,
        "additionalProperties": { "type": "string", "minLength": 1, "maxLength": MAX_MODEL_LEN },
    })
}

pub(crate) fn failure_classes(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "maxItems": FAILURE_CLASSES.len(),
        "items": { "type": "string", "enum": FAILURE_CLASSES },
    })
}

pub(crate) fn status_codes(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "maxItems": MAX_STATUS_CODES,
        "items": { "type": "integer", "format": "int32", "minimum": 100, "maximum": 599 },
    })
}

pub(crate) fn models(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "minItems": 1,
        "maxItems": MAX_MODELS,
        "items": { "type": "string", "minLength": 1, "maxLength": MAX_MODEL_LEN },
    })
}

/// CEL rule on `spec.headers`: no static header may carry a key, refused by name,
/// case-insensitively (RE2's `(?i)`), as `compile` refuses them.
pub const KEY_HEADER_RULE: &str = "self.all(k, !k.matches('(?i)(^(authorization|proxy-authorization|cookie)$|api-key|api_key|apikey|token|secret|password|subscription-key)'))";
/// Its message (a CEL expression): the first header refused, by name.
pub const KEY_HEADER_MESSAGE: &str = "'header ' + self.filter(k, k.matches('(?i)(^(authorization|proxy-authorization|cookie)$|api-key|api_key|apikey|token|secret|password|subscription-key)'))[0] + ' may carry a key, and static headers may not (refused: authorization, proxy-authorization, cookie, and names containing api-key, api_key, apikey, token, secret, password or subscription-key); the key comes from the Secret'";

pub(crate) fn headers(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "maxProperties": MAX_HEADERS,
        "additionalProperties": { "type": "string", "maxLength": MAX_HEADER_VALUE_LEN },
    })
}

pub(crate) fn shared_with(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "maxItems": MAX_SHARED_WITH,
        "items": { "type": "string", "minLength": 1, "maxLength": MAX_NAMESPACE_LEN, "pattern": SHARED_WITH_PATTERN },
    })
}

pub(crate) fn client_routes(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "minItems": 1,
        "maxItems": MAX_CLIENT_ROUTES,
        "items": { "type": "string", "minLength": 1, "maxLength": MAX_ROUTE_REF_LEN, "pattern": ROUTE_REF_PATTERN },
    })
}

/// `conditions` as a map-list keyed by `type`, so server-side apply merges them the
/// way every built-in resource does.
pub(crate) fn conditions(generator: &mut SchemaGenerator) -> Schema {
    let item =
        generator.subschema_for::<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>();
    json_schema!({
        "type": "array",
        "items": item,
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
    })
}
