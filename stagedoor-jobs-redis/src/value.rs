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
            .filter_map(|(k, v)| Some((bytes(k)?.into(), bytes(v)?.into())))
            .collect(),
        other => array(other)
            .chunks(2)
            .filter_map(|c| match c {
                [k, v] => Some((bytes(k)?.into(), bytes(v)?.into())),
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

/// [`bytes`], taking the value's own buffer instead of copying it.
pub(crate) fn into_bytes(v: Value) -> Option<Vec<u8>> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.into_bytes()),
        Value::Int(i) => Some(i.to_string().into_bytes()),
        Value::VerbatimString { text, .. } => Some(text.into_bytes()),
        Value::Okay => Some(b"OK".to_vec()),
        _ => None,
    }
}

/// [`string`], taking the value's own buffer.
pub(crate) fn into_string(v: Value) -> Option<String> {
    into_bytes(v).map(|b| {
        String::from_utf8(b).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
    })
}

/// [`array`], taking the items.
pub(crate) fn into_array(v: Value) -> Vec<Value> {
    match v {
        Value::Array(a) | Value::Set(a) => a,
        _ => Vec::new(),
    }
}

/// [`fields`], taking the names and values.
pub(crate) fn into_fields(v: Value) -> Fields {
    match v {
        Value::Map(m) => m
            .into_iter()
            .filter_map(|(k, v)| Some((into_bytes(k)?.into(), into_bytes(v)?.into())))
            .collect(),
        other => {
            let items = into_array(other);
            let mut out = Vec::with_capacity(items.len() / 2);
            let mut it = items.into_iter();
            while let (Some(k), Some(v)) = (it.next(), it.next()) {
                if let (Some(k), Some(v)) = (into_bytes(k), into_bytes(v)) {
                    out.push((k.into(), v.into()));
                }
            }
            out
        }
    }
}

/// [`entries`], taking the ids and fields.
pub(crate) fn into_entries(v: Value) -> Vec<(String, Fields)> {
    into_array(v).into_iter().filter_map(into_entry).collect()
}

/// One entry of an XRANGE/XREVRANGE reply, `[id, fields]`, taken: (id, fields).
pub(crate) fn into_entry(e: Value) -> Option<(String, Fields)> {
    let mut it = into_array(e).into_iter();
    match (it.next(), it.next(), it.next()) {
        (Some(id), Some(f), None) => Some((into_string(id)?, into_fields(f))),
        _ => None,
    }
}

/// The entries of an XREADGROUP reply of several streams, each with its stream's key, taken
/// out of the reply (not copied).
pub(crate) fn into_streams_reply(v: Value) -> Vec<(String, Vec<(String, Fields)>)> {
    match v {
        Value::Nil => Vec::new(),
        Value::Map(m) => m
            .into_iter()
            .filter_map(|(k, e)| Some((into_string(k)?, into_entries(e))))
            .collect(),
        other => into_array(other)
            .into_iter()
            .filter_map(|s| {
                let mut it = into_array(s).into_iter();
                match (it.next(), it.next(), it.next()) {
                    (Some(k), Some(e), None) => Some((into_string(k)?, into_entries(e))),
                    _ => None,
                }
            })
            .collect(),
    }
}
