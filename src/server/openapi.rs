//! The OpenAPI 3 document of the JSON API, with every body schema
//! generated from the types in `body.rs`.

use schemars::generate::SchemaSettings;
use schemars::{JsonSchema, SchemaGenerator};
use serde_json::{Map, Value, json};

use super::body::*;

/// One operation: method, path, summary, request body, 200 body.
struct Op {
    method: &'static str,
    path: &'static str,
    summary: &'static str,
    request: Option<Value>,
    response: Value,
    params: &'static [(&'static str, &'static str, &'static str)],
    /// Also answers 502 when the LLM behind it fails.
    calls_llm: bool,
}

fn op<T: JsonSchema>(g: &mut SchemaGenerator, method: &'static str, path: &'static str, summary: &'static str) -> Op {
    Op {
        method,
        path,
        summary,
        request: None,
        response: json_content(g.subschema_for::<T>()),
        params: &[],
        calls_llm: false,
    }
}

fn json_content(schema: impl serde::Serialize) -> Value {
    json!({"content": {"application/json": {"schema": schema}}})
}

const TREE: (&str, &str, &str) = ("tree", "path", "string");
/// `?profile=` of `/v1/record`: one of the built-in profiles.
const PROFILE: (&str, &str, &str) = ("profile", "query", "string");
const ID: (&str, &str, &str) = ("id", "path", "string");

fn operations(g: &mut SchemaGenerator) -> Vec<Op> {
    let with_body = |mut o: Op, request: Value| {
        o.request = Some(request);
        o
    };
    let with_params = |mut o: Op, params: &'static [(&'static str, &'static str, &'static str)]| {
        o.params = params;
        o
    };
    let text = |mut o: Op, kind: &str| {
        o.response = json!({"content": {kind: {"schema": {"type": "string"}}}});
        o
    };
    let query = json_content(g.subschema_for::<TreeQuery>());
    let query_batch = json_content(g.subschema_for::<QueryBatchRequest>());
    let insert = json_content(g.subschema_for::<InsertRequest>());
    let batch = json_content(g.subschema_for::<InsertBatchRequest>());
    let retrievals = json_content(g.subschema_for::<RetrievalsRequest>());
    let consolidate = json_content(g.subschema_for::<ConsolidateRequest>());
    let summaries = json_content(g.subschema_for::<SummariesRequest>());
    let ops = vec![
        op::<HealthOut>(g, "get", "/healthz", "Liveness"),
        text(
            op::<HealthOut>(g, "get", "/metrics", "Prometheus metrics"),
            "text/plain",
        ),
        op::<BankInfo>(g, "get", "/v1/bank", "Bank parameters and trees"),
        op::<StatsReply>(g, "get", "/v1/stats", "Counts and sizes (as `deltamem stats --json`)"),
        op::<VerifyReply>(g, "get", "/v1/verify", "Check every checksum and link"),
        with_params(
            with_body(
                op::<QueryReply>(g, "post", "/v1/trees/{tree}/query", "Top-k matches of one embedding"),
                query,
            ),
            &[TREE],
        ),
        with_params(
            with_body(
                op::<QueryBatchAnswer>(
                    g,
                    "post",
                    "/v1/trees/{tree}/query_batch",
                    "Top-k matches of many embeddings",
                ),
                query_batch,
            ),
            &[TREE],
        ),
        with_params(
            op::<NodePage>(g, "get", "/v1/trees/{tree}/nodes", "A page of a tree's nodes"),
            &[TREE, ("offset", "query", "integer"), ("limit", "query", "integer")],
        ),
        with_params(
            op::<OutlineOut>(
                g,
                "get",
                "/v1/trees/{tree}/outline",
                "A page of a tree's shape, without payloads",
            ),
            &[TREE, ("offset", "query", "integer"), ("limit", "query", "integer")],
        ),
        with_body(
            op::<NodeList>(g, "post", "/v1/summaries", "Summaries of the nodes named"),
            summaries,
        ),
        with_params(
            op::<HistoryOut>(
                g,
                "get",
                "/v1/trees/{tree}/history",
                "A tree's growth, consolidations and most-hit nodes",
            ),
            &[TREE, ("points", "query", "integer"), ("top", "query", "integer")],
        ),
        with_params(
            text(
                op::<HealthOut>(g, "get", "/v1/trees/{tree}/dump", "Every node of a tree as JSON Lines"),
                "application/x-ndjson",
            ),
            &[TREE],
        ),
        with_body(
            op::<InsertReply>(g, "post", "/v1/nodes", "Store one node; answered once durable"),
            insert,
        ),
        with_body(
            op::<AcksOut>(g, "post", "/v1/nodes/batch", "Store nodes in one transaction"),
            batch,
        ),
        with_params(
            op::<NodeDetail>(g, "get", "/v1/nodes/{id}", "One node with its children"),
            &[ID],
        ),
        with_params(
            op::<ChainOut>(g, "get", "/v1/nodes/{id}/chain", "Chain from the top-level root"),
            &[ID, ("render", "query", "boolean")],
        ),
        with_params(
            op::<ChildrenOut>(g, "get", "/v1/nodes/{id}/children", "A node's children"),
            &[ID],
        ),
        with_params(
            op::<HitReply>(g, "post", "/v1/nodes/{id}/hit", "Count one success hit"),
            &[ID],
        ),
        with_params(
            with_body(
                op::<ConsolidateReply>(
                    g,
                    "post",
                    "/v1/nodes/{id}/consolidate",
                    "Write a distilled root for a node's chain",
                ),
                consolidate,
            ),
            &[ID],
        ),
        with_body(
            op::<RetrievalsOut>(g, "post", "/v1/retrievals", "Count retrievals of a used chain"),
            retrievals,
        ),
        with_params(
            op::<NodeList>(g, "get", "/v1/search", "Find nodes by index, external id or text"),
            &[
                ("q", "query", "string"),
                ("tree", "query", "string"),
                ("limit", "query", "integer"),
            ],
        ),
        with_params(
            op::<DueOut>(g, "get", "/v1/due", "Nodes due for consolidation"),
            &[("tree", "query", "string")],
        ),
    ];
    #[cfg(feature = "agent")]
    let ops = ops.into_iter().chain(agent_operations(g)).collect();
    ops
}

/// `/v1/retrieve` and `/v1/record` (feature `agent`).
#[cfg(feature = "agent")]
fn agent_operations(g: &mut SchemaGenerator) -> Vec<Op> {
    use crate::agent::{Episode, RecordOutcome, Retrieval};
    let mut retrieve = op::<Retrieval>(
        g,
        "post",
        "/v1/retrieve",
        "The best chain of each tree for a task and an environment (as `deltamem retrieve --json`)",
    );
    retrieve.request = Some(json_content(g.subschema_for::<super::agent::RetrieveRequest>()));
    let mut record = op::<RecordOutcome>(
        g,
        "post",
        "/v1/record",
        "Learn from a finished episode through the LLM (as `deltamem record --json`); answered once durable",
    );
    record.request = Some(json_content(g.subschema_for::<Episode>()));
    record.params = &[PROFILE];
    record.calls_llm = true;
    vec![retrieve, record]
}

/// The names `?profile=` and a retrieval's `profile` take.
#[cfg(feature = "agent")]
fn profile_names() -> Vec<&'static str> {
    crate::agent::DomainProfile::BUILT_IN.to_vec()
}

#[cfg(not(feature = "agent"))]
fn profile_names() -> Vec<&'static str> {
    Vec::new()
}

/// A retrieval's profile is one of the built-in names (or null, for the
/// default): the server refuses any other with a 400.
#[cfg(feature = "agent")]
fn constrain_agent_schemas(schemas: &mut Map<String, Value>) {
    let profile = schemas
        .get_mut("RetrieveRequest")
        .and_then(|s| s.pointer_mut("/properties/profile"))
        .expect("the document has RetrieveRequest.profile");
    let mut names = json!(profile_names());
    // OpenAPI 3.0.3: a nullable property's enum must list null to allow it.
    names.as_array_mut().expect("an array").push(Value::Null);
    profile["enum"] = names;
}

#[cfg(not(feature = "agent"))]
fn constrain_agent_schemas(_: &mut Map<String, Value>) {}

/// Statuses every operation may answer with an error body.
const ERROR_STATUSES: [&str; 10] = ["400", "401", "403", "404", "405", "408", "409", "413", "415", "503"];

/// What the serving bank and the server's limits allow, beyond what the
/// types say: written into the document so that a client, and a fuzzer
/// driven by the schema, sends what can succeed (an embedding of any other
/// length, or a tree the bank lacks, gets a 400 or 404 and nothing more).
pub struct Bounds {
    pub dim: u32,
    pub trees: Vec<String>,
    pub batch_items: usize,
    /// Most matches one query may ask for.
    pub k_max: usize,
    /// Most nodes a page or a search answers with.
    pub page_items: usize,
    /// Whether every request must carry the bearer token.
    pub token_required: bool,
}

pub fn document(bounds: &Bounds) -> Value {
    let mut g = SchemaSettings::openapi3().into_generator();
    let ops = operations(&mut g);
    let error = json_content(g.subschema_for::<ErrorOut>());
    let mut paths = Map::new();
    for o in ops {
        let mut responses = Map::new();
        responses.insert("200".into(), with_description(o.response, "OK"));
        for status in ERROR_STATUSES {
            responses.insert(status.into(), with_description(error.clone(), "error"));
        }
        if o.calls_llm {
            responses.insert("502".into(), with_description(error.clone(), "the LLM failed"));
        }
        let mut operation = json!({"summary": o.summary, "responses": responses});
        if let Some(body) = o.request {
            let mut body = body;
            body["required"] = json!(true);
            operation["requestBody"] = body;
        }
        let params: Vec<Value> = o
            .params
            .iter()
            .map(|&(name, place, kind)| {
                let mut param = json!({"name": name, "in": place, "required": place == "path" || name == "q", "schema": {"type": kind}});
                // A tree (in a path or a query) is one of the bank's.
                if name == "tree" {
                    param["schema"]["enum"] = json!(bounds.trees);
                }
                if let Some((low, high)) = (place == "query").then(|| query_range(o.path, name, bounds)).flatten() {
                    param["schema"]["minimum"] = json!(low);
                    param["schema"]["maximum"] = json!(high);
                }
                if (name, place, kind) == PROFILE {
                    param["schema"]["enum"] = json!(profile_names());
                }
                param
            })
            .collect();
        if !params.is_empty() {
            operation["parameters"] = Value::Array(params);
        }
        let entry = paths.entry(o.path.to_string()).or_insert_with(|| json!({}));
        entry[o.method] = operation;
    }
    let mut schemas: Map<String, Value> = g.take_definitions(true).into_iter().collect();
    constrain_schemas(&mut schemas, bounds);
    constrain_agent_schemas(&mut schemas);
    let mut paths = Value::Object(paths);
    bound_unsigned(&mut paths);
    let mut schemas = Value::Object(schemas);
    bound_unsigned(&mut schemas);
    json!({
        "openapi": "3.0.3",
        "info": {"title": "deltamem serve", "version": env!("CARGO_PKG_VERSION"),
                 "description": "The HTTP API of a deltamem bank (docs/SERVER.md)."},
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}
        },
        // Without a token a bearer header may still be sent (it is not
        // checked); with one, no request goes without it.
        "security": match bounds.token_required {
            true => json!([{"bearer": []}]),
            false => json!([{}, {"bearer": []}]),
        }
    })
}

/// The range the server accepts for an integer query parameter: a page
/// has at most `page_items` (an outline page `OUTLINE_PAGE_MAX`), a history
/// at most `page_items` samples and top nodes, an offset is a u32.
fn query_range(path: &str, name: &str, bounds: &Bounds) -> Option<(u64, u64)> {
    let page_items = bounds.page_items as u64;
    match name {
        "limit" if path.ends_with("/outline") => Some((1, u64::from(super::outline::OUTLINE_PAGE_MAX))),
        "limit" | "points" => Some((1, page_items)),
        "top" => Some((0, page_items)),
        "offset" => Some((0, u64::from(u32::MAX))),
        _ => None,
    }
}

/// Every embedding holds exactly `dim` finite f32s, not all zero (as an
/// array, or as base64 of that many values in a request); a query
/// asks for at most `k_max` matches; a batch (of nodes, of query
/// embeddings, of ids) has at most `batch_items` entries; a tree in a body
/// names one of the bank's.
fn constrain_schemas(schemas: &mut Map<String, Value>, bounds: &Bounds) {
    let vector = json!(bounds.dim);
    let mut set = |schema: &str, field: &str, f: &dyn Fn(&mut Value)| match schemas
        .get_mut(schema)
        .and_then(|s| s.pointer_mut(&format!("/properties/{field}")))
    {
        Some(property) => f(property),
        None => panic!("the document has no property {schema}.{field}"),
    };
    // Components beyond f32's range parse to infinity, which is refused.
    let exact_dim = |p: &mut Value| {
        p["minItems"] = vector.clone();
        p["maxItems"] = vector.clone();
        p["items"]["minimum"] = json!(-f32::MAX);
        p["items"]["maximum"] = json!(f32::MAX);
        // Not all zeros: such a vector has no direction to normalise to.
        p["not"] = json!({"items": {"enum": [0]}});
    };
    // A request's embedding: that array, or its base64 (4 bytes per
    // value, so a fixed length); the pattern is standard padded base64.
    let either_spelling = |p: &mut Value| {
        let mut array = json!({"type": "array", "items": {"type": "number", "format": "float"}});
        exact_dim(&mut array);
        let base64_chars = 4 * (4 * u64::from(bounds.dim)).div_ceil(3);
        let base64 = json!({"type": "string", "pattern": canonical_base64(4 * u64::from(bounds.dim)),
                            "minLength": base64_chars, "maxLength": base64_chars});
        let description = p.get("description").cloned();
        *p = json!({"anyOf": [array, base64]});
        if let Some(d) = description {
            p["description"] = d;
        }
    };
    let k = |p: &mut Value| {
        p["minimum"] = json!(1);
        p["maximum"] = json!(bounds.k_max);
    };
    let batch = |p: &mut Value| p["maxItems"] = json!(bounds.batch_items);
    let tree = |p: &mut Value| p["enum"] = json!(bounds.trees);
    set("InsertRequest", "embedding", &either_spelling);
    set("InsertRequest", "tree", &tree);
    set("TreeQuery", "embedding", &either_spelling);
    set("TreeQuery", "k", &k);
    set("QueryBatchRequest", "k", &k);
    set("NodeDetail", "embedding", &exact_dim);
    set("QueryBatchRequest", "embeddings", &|p: &mut Value| {
        batch(p);
        either_spelling(&mut p["items"]);
    });
    set("InsertBatchRequest", "nodes", &batch);
    set("RetrievalsRequest", "ids", &batch);
    set("SummariesRequest", "ids", &batch);
}

/// Gives every unsigned integer its type's largest value as `maximum`:
/// schemars states only the minimum (0), and a larger number (or one
/// spelled as a float beyond the range) is refused by the parser, so a
/// client generating from the schema must be told where the range ends.
fn bound_unsigned(value: &mut Value) {
    match value {
        Value::Object(map) => {
            let largest = match map.get("format").and_then(Value::as_str) {
                Some("uint8") => Some(u64::from(u8::MAX)),
                Some("uint16") => Some(u64::from(u16::MAX)),
                Some("uint32") => Some(u64::from(u32::MAX)),
                Some("uint64" | "uint") => Some(u64::MAX),
                _ => None,
            };
            if let Some(largest) = largest.filter(|_| !map.contains_key("maximum")) {
                map.insert("maximum".into(), json!(largest));
            }
            map.values_mut().for_each(bound_unsigned);
        }
        Value::Array(items) => items.iter_mut().for_each(bound_unsigned),
        _ => {}
    }
}

/// The regular expression of the one base64 spelling the server decodes
/// for `bytes` bytes: padded, and the last character before the padding
/// carries no stray bits (the decoder refuses such a string, so the
/// document must not allow it: a client or a fuzzer generating from the
/// schema would be refused for a string the schema calls valid).
fn canonical_base64(bytes: u64) -> String {
    const ANY: &str = "[A-Za-z0-9+/]";
    let whole = 4 * (bytes / 3);
    match bytes % 3 {
        // One byte left: 6 + 2 bits, the second character's low 4 zero.
        1 => format!("^{ANY}{{{whole}}}{ANY}[AQgw]==$"),
        // Two bytes left: 6 + 6 + 4 bits, the third character's low 2 zero.
        2 => format!("^{ANY}{{{whole}}}{ANY}{{2}}[AEIMQUYcgkosw048]=$"),
        _ => format!("^{ANY}{{{whole}}}$"),
    }
}

fn with_description(mut v: Value, description: &str) -> Value {
    v["description"] = json!(description);
    v
}
