//! The claims of a verified token, and the paths that name one.

use serde_json::{Map, Value};

use super::error::JwtError;

/// A string anywhere in the value (a key or a value) holds a NUL.
fn holds_nul(v: &Value) -> bool {
    match v {
        Value::String(s) => s.contains('\0'),
        Value::Array(a) => a.iter().any(holds_nul),
        Value::Object(m) => map_holds_nul(m),
        _ => false,
    }
}

pub(super) fn map_holds_nul(m: &Map<String, Value>) -> bool {
    m.iter().any(|(k, v)| k.contains('\0') || holds_nul(v))
}

/// The claims of a verified token.
#[derive(Debug, Clone)]
pub struct Claims {
    pub(super) map: Map<String, Value>,
    /// The claims as the token carries them: the JSON text as signed, so
    /// that SQL reads exactly what the issuer wrote (numbers of any size,
    /// every key; PostgreSQL's `json` operators, like this module, take the
    /// last of duplicate keys).
    pub(super) json: String,
    pub(super) exp: Option<f64>,
    pub(super) nbf: Option<f64>,
}

impl Claims {
    /// The claims as JSON text (for `request.jwt.claims`).
    pub fn json(&self) -> &str {
        &self.json
    }

    /// Valid at `now` with `leeway` seconds: `exp` not passed, `nbf` reached.
    pub fn check_time(&self, now: i64, leeway: i64) -> Result<(), JwtError> {
        let (now, leeway) = (now as f64, leeway as f64);
        if self.exp.is_some_and(|exp| now >= exp + leeway) {
            return Err(JwtError::Expired);
        }
        if self.nbf.is_some_and(|nbf| now + leeway < nbf) {
            return Err(JwtError::NotYetValid);
        }
        Ok(())
    }

    /// A claim by dotted path (`app.role`): a string as it is, another
    /// value as JSON text; None when missing or null.
    pub fn get_path(&self, path: &[String]) -> Option<String> {
        let (first, rest) = path.split_first()?;
        let mut v = self.map.get(first)?;
        for step in rest {
            v = v.as_object()?.get(step)?;
        }
        value_text(v)
    }

    /// A top-level claim as text (the `$sqldb_jwt_claim_NAME` variables).
    /// nginx writes variable names in lower case, so a name that is not a
    /// claim matches one in any letter case (the first in code-point
    /// order), as `$arg_NAME` matches an argument.
    pub fn get(&self, name: &str) -> Option<String> {
        let v = self.map.get(name).or_else(|| {
            self.map
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v)
        })?;
        value_text(v)
    }
}

fn value_text(v: &Value) -> Option<String> {
    match v {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// `sqldb_jwt_role_claim`: a dotted path; every step a non-empty name.
pub fn parse_claim_path(text: &str) -> Option<Vec<String>> {
    let steps: Vec<String> = text.split('.').map(str::to_owned).collect();
    (!steps.iter().any(String::is_empty)).then_some(steps)
}
