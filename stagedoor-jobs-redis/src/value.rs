//! Reading the server's replies.

use redis::Value;

use crate::entry::Fields;

pub(crate) fn bytes(v: &Value) -> Option<Vec<u8>> {
    match v {
        Value::BulkString(b) => Some(b.clone()),
        Value::SimpleString(s) => Some(s.clone().into_bytes()),
        Value::Int(i) => Some(i.to_string().into_bytes()),
        Value::VerbatimString { text, .. } => Some(text.clone().into_bytes()),
        Value::Okay => Some(b"OK".to_vec()),
        _ => None,
    }
}

pub(crate) fn string(v: &Value) -> Option<String> {
    bytes(v).map(|b| String::from_utf8_lossy(&b).into_owned())
}

pub(crate) fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        other => string(other)?.parse().ok(),
    }
}

pub(crate) fn array(v: &Value) -> &[Value] {
    match v {
        Value::Array(a) | Value::Set(a) => a,
        _ => &[],
    }
}

/// Field/value pairs of an entry (an array, or a map on RESP3), names and values as bytes.
pub(crate) fn fields(v: &Value) -> Fields {
    match v {
        Value::Map(m) => m
            .iter()
            .filter_map(|(k, v)| Some((bytes(k)?, bytes(v)?)))
            .collect(),
        other => array(other)
            .chunks(2)
            .filter_map(|c| match c {
                [k, v] => Some((bytes(k)?, bytes(v)?)),
                _ => None,
            })
            .collect(),
    }
}

/// The entries of one stream in an XRANGE/XREVRANGE reply: (id, fields).
pub(crate) fn entries(v: &Value) -> Vec<(String, Fields)> {
    array(v)
        .iter()
        .filter_map(|e| match array(e) {
            [id, f] => Some((string(id)?, fields(f))),
            _ => None,
        })
        .collect()
}

/// The entries of an XREADGROUP reply (one stream).
pub(crate) fn read_reply(v: &Value) -> Vec<(String, Fields)> {
    match v {
        Value::Nil => Vec::new(),
        Value::Map(m) => m.iter().flat_map(|(_, e)| entries(e)).collect(),
        other => array(other)
            .iter()
            .flat_map(|s| match array(s) {
                [_, e] => entries(e),
                _ => Vec::new(),
            })
            .collect(),
    }
}
