//! What each target can express of a client's JSON Schema for a structured answer
//! (docs/translation.md#structured-output): a schema a target's API cannot take is refused
//! for that target, naming the construct and where it is, so the walk moves to a target
//! that can.
//!
//! * [`recursive_ref`]: a `$ref` that leads back to a schema it is part of. Gemini
//!   unrolls recursion to a finite depth only when it is optional, and Anthropic's
//!   structured outputs take none.
//! * [`claude_subset`]: Anthropic's structured outputs (also what Bedrock's
//!   `outputConfig.textFormat` enforces for Claude): closed objects
//!   (`additionalProperties: false`, added where the client left it out: the answer
//!   still matches the client's schema), no numeric, length or count limits, no
//!   `oneOf`, enums of plain values, a fixed list of string formats, local `$ref`s.
//! * [`openai_strict`]: whether OpenAI's strict mode takes the schema as it is
//!   (every object closed and all its properties required).
//!
//! Schemas are client input: the walks are bounded by the JSON's depth (serde_json
//! parses at most 128 levels) and visit each referenced schema once.

use serde_json::{Map, Value};

/// Keywords Anthropic's structured outputs cannot enforce (its SDK moves them into
/// the description; a gateway cannot do that silently).
const UNENFORCED: [&str; 10] = [
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minLength",
    "maxLength",
    "maxItems",
    "minProperties",
    "maxProperties",
];

/// String formats Anthropic's structured outputs enforce.
const FORMATS: [&str; 10] = [
    "date-time",
    "time",
    "date",
    "duration",
    "email",
    "hostname",
    "uri",
    "ipv4",
    "ipv6",
    "uuid",
];

/// Sub-schema holders: keyword → whether it holds a map of schemas (`properties`,
/// `$defs`), a list (`anyOf`) or one schema (`items`).
fn children(node: &Map<String, Value>) -> impl Iterator<Item = (String, &Value)> {
    node.iter().flat_map(|(k, v)| {
        let many: Vec<(String, &Value)> = match (k.as_str(), v) {
            ("properties" | "$defs" | "definitions" | "patternProperties", Value::Object(m)) => m
                .iter()
                .map(|(name, s)| (format!("/{k}/{}", escape(name)), s))
                .collect(),
            ("anyOf" | "allOf" | "oneOf" | "prefixItems", Value::Array(a)) => a
                .iter()
                .enumerate()
                .map(|(i, s)| (format!("/{k}/{i}"), s))
                .collect(),
            ("items" | "additionalProperties" | "not" | "contains", s @ Value::Object(_)) => {
                vec![(format!("/{k}"), s)]
            }
            _ => Vec::new(),
        };
        many
    })
}

/// A JSON pointer token (`~` → `~0`, `/` → `~1`).
fn escape(name: &str) -> String {
    name.replace('~', "~0").replace('/', "~1")
}

/// The first local `$ref` that makes `schema` recursive (it points at a schema
/// that contains it, directly or through other references): its value. A walk
/// from the root along properties, items and references, each referenced schema
/// explored once.
pub(super) fn recursive_ref(schema: &Value) -> Option<String> {
    let mut chain = vec![String::new()];
    let mut done = Vec::new();
    walk_refs(schema, schema, &mut chain, &mut done)
}

/// `node` is at `chain.last()`, inside every schema `chain` holds.
fn walk_refs(
    root: &Value,
    node: &Value,
    chain: &mut Vec<String>,
    done: &mut Vec<String>,
) -> Option<String> {
    let Value::Object(obj) = node else {
        return None;
    };
    if let Some(r) = obj.get("$ref").and_then(Value::as_str)
        && let Some(pointer) = r.strip_prefix('#')
    {
        // A reference to a schema this one is inside of closes a loop.
        if chain.iter().any(|c| c == pointer) {
            return Some(r.to_owned());
        }
        if !done.iter().any(|d| d == pointer)
            && let Some(target) = root.pointer(pointer)
        {
            chain.push(pointer.to_owned());
            let found = walk_refs(root, target, chain, done);
            chain.pop();
            if found.is_some() {
                return found;
            }
            done.push(pointer.to_owned());
        }
    }
    let here = chain.last().cloned().unwrap_or_default();
    for (at, child) in children(obj) {
        // Definitions are reached through the references to them.
        if at.starts_with("/$defs/") || at.starts_with("/definitions/") {
            continue;
        }
        chain.push(format!("{here}{at}"));
        let found = walk_refs(root, child, chain, done);
        chain.pop();
        if found.is_some() {
            return found;
        }
    }
    None
}

/// What a schema lacks for a target: the JSON pointer within the schema where, and
/// the construct.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Inexpressible {
    pub at: String,
    pub construct: String,
}

/// `schema` as Anthropic's structured outputs take it (objects closed where the
/// client left them open by default), or the first construct they cannot enforce.
pub(super) fn claude_subset(schema: &Value) -> Result<Value, Inexpressible> {
    if let Some(r) = recursive_ref(schema) {
        return Err(Inexpressible {
            at: String::new(),
            construct: format!("a recursive $ref ({r})"),
        });
    }
    let mut out = schema.clone();
    close(&mut out, String::new())?;
    Ok(out)
}

fn close(node: &mut Value, at: String) -> Result<(), Inexpressible> {
    let Value::Object(obj) = node else {
        return Ok(());
    };
    let refuse = |construct: String| {
        Err(Inexpressible {
            at: at.clone(),
            construct,
        })
    };
    for k in UNENFORCED {
        if obj.contains_key(k) {
            return refuse(format!("the keyword {k}"));
        }
    }
    if obj.contains_key("oneOf") {
        return refuse("oneOf (use anyOf)".into());
    }
    if let Some(n) = obj.get("minItems").and_then(Value::as_u64)
        && n > 1
    {
        return refuse(format!("minItems {n} (only 0 or 1)"));
    }
    if let Some(f) = obj.get("format").and_then(Value::as_str)
        && !FORMATS.contains(&f)
    {
        return refuse(format!("the string format {f:?}"));
    }
    if let Some(r) = obj.get("$ref").and_then(Value::as_str)
        && !r.starts_with('#')
    {
        return refuse(format!("an external $ref ({r})"));
    }
    for k in ["enum", "const"] {
        let plain = |v: &Value| !matches!(v, Value::Object(_) | Value::Array(_));
        let ok = match obj.get(k) {
            None => true,
            Some(Value::Array(vs)) if k == "enum" => vs.iter().all(plain),
            Some(v) => k == "const" && plain(v),
        };
        if !ok {
            return refuse(format!(
                "{k} with values that are not strings, numbers, booleans or null"
            ));
        }
    }
    let is_object = obj.contains_key("properties")
        || match obj.get("type") {
            Some(Value::String(t)) => t == "object",
            Some(Value::Array(ts)) => ts.iter().any(|t| t == "object"),
            _ => false,
        };
    if is_object {
        match obj.get("additionalProperties") {
            None => {
                obj.insert("additionalProperties".into(), Value::Bool(false));
            }
            Some(Value::Bool(false)) => {}
            Some(_) => return refuse("additionalProperties other than false".into()),
        }
    }
    for (key, value) in obj.iter_mut() {
        match (key.as_str(), value) {
            ("properties" | "$defs" | "definitions", Value::Object(m)) => {
                for (name, s) in m.iter_mut() {
                    close(s, format!("{at}/{key}/{}", escape(name)))?;
                }
            }
            ("anyOf" | "allOf", Value::Array(a)) => {
                for (i, s) in a.iter_mut().enumerate() {
                    close(s, format!("{at}/{key}/{i}"))?;
                }
            }
            ("items", s @ Value::Object(_)) => close(s, format!("{at}/items"))?,
            ("patternProperties" | "prefixItems" | "not" | "contains" | "if", _) => {
                return Err(Inexpressible {
                    at: at.clone(),
                    construct: format!("the keyword {key}"),
                });
            }
            _ => {}
        }
    }
    Ok(())
}

/// Whether OpenAI's strict mode takes `schema` as it is: every object closed
/// (`additionalProperties: false`) and all its properties required.
pub(super) fn openai_strict(schema: &Value) -> bool {
    let Value::Object(obj) = schema else {
        return true;
    };
    if let Some(Value::Object(props)) = obj.get("properties") {
        if obj.get("additionalProperties") != Some(&Value::Bool(false)) {
            return false;
        }
        let required: Vec<&str> = obj
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if !props.keys().all(|k| required.contains(&k.as_str())) {
            return false;
        }
    } else if obj.get("type").and_then(Value::as_str) == Some("object")
        && obj.get("additionalProperties") != Some(&Value::Bool(false))
    {
        return false;
    }
    children(obj).all(|(_, child)| openai_strict(child))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn recursion_is_found_through_defs_and_the_root() {
        let tree = json!({"$ref": "#/$defs/node", "$defs": {"node": {"type": "object",
            "properties": {"value": {"type": "string"},
                "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}}});
        assert_eq!(recursive_ref(&tree).as_deref(), Some("#/$defs/node"));
        let root = json!({"type": "object", "properties": {"next": {"$ref": "#"}}});
        assert_eq!(recursive_ref(&root).as_deref(), Some("#"));
        // Two definitions that point at each other.
        let pair = json!({"$defs": {"a": {"properties": {"b": {"$ref": "#/$defs/b"}}},
            "b": {"properties": {"a": {"$ref": "#/$defs/a"}}}},
            "properties": {"x": {"$ref": "#/$defs/a"}}});
        assert!(recursive_ref(&pair).is_some());
        // A definition used twice is no recursion.
        let shared = json!({"$defs": {"point": {"type": "object", "properties": {
            "x": {"type": "number"}}}}, "type": "object", "properties": {
            "from": {"$ref": "#/$defs/point"}, "to": {"$ref": "#/$defs/point"}}});
        assert_eq!(recursive_ref(&shared), None);
        // A definition nobody refers to is not walked.
        let unused = json!({"$defs": {"loop": {"properties": {"l": {"$ref": "#/$defs/loop"}}}},
            "type": "string"});
        assert_eq!(recursive_ref(&unused), None);
    }

    #[test]
    fn the_claude_subset_closes_objects_and_names_what_it_lacks() {
        let open = json!({"type": "object", "properties": {"a": {"type": "object",
            "properties": {"b": {"type": "string"}}}}, "required": ["a"]});
        let closed = claude_subset(&open).unwrap();
        assert_eq!(closed["additionalProperties"], false);
        assert_eq!(closed["properties"]["a"]["additionalProperties"], false);
        let bounded = json!({"type": "object", "properties": {"age": {"type": "integer",
            "minimum": 0}}});
        assert_eq!(
            claude_subset(&bounded).unwrap_err(),
            Inexpressible {
                at: "/properties/age".into(),
                construct: "the keyword minimum".into()
            }
        );
        let extra = json!({"type": "object", "additionalProperties": {"type": "string"}});
        assert!(claude_subset(&extra).is_err());
        let tree = json!({"type": "object", "properties": {"next": {"$ref": "#"}}});
        assert!(
            claude_subset(&tree)
                .unwrap_err()
                .construct
                .contains("recursive")
        );
    }

    #[test]
    fn openai_strict_wants_closed_objects_with_everything_required() {
        let strict = json!({"type": "object", "properties": {"a": {"type": "string"}},
            "required": ["a"], "additionalProperties": false});
        assert!(openai_strict(&strict));
        let optional = json!({"type": "object", "properties": {"a": {"type": "string"},
            "b": {"type": "string"}}, "required": ["a"], "additionalProperties": false});
        assert!(!openai_strict(&optional));
        let nested_open = json!({"type": "object", "properties": {"a": {"type": "object",
            "properties": {}}}, "required": ["a"], "additionalProperties": false});
        assert!(!openai_strict(&nested_open));
    }
}
