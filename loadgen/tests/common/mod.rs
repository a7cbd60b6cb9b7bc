//! What the loadgen end-to-end tests share: running the binary, reading its JSON,
//! checking it against the schema.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};

pub fn loadgen(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .args(args)
        .output()
        .expect("run loadgen")
}

/// The harness the end-to-end tests share (a command's output as text, a JSON file read
/// whole).
#[allow(unused_imports)]
pub use e2e::{read_json, text};

pub fn schema(file: &str) -> jsonschema::Validator {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("schema")
        .join(file);
    let s: serde_json::Value =
        serde_json::from_slice(&std::fs::read(path).expect("schema")).expect("json");
    jsonschema::validator_for(&s).expect("valid schema")
}

pub fn validate_against(file: &str, v: &serde_json::Value) {
    let errors: Vec<String> = schema(file)
        .iter_errors(v)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "schema errors: {errors:#?}");
}

pub fn validate(v: &serde_json::Value) {
    validate_against("result-v2.schema.json", v);
}
