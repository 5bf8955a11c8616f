//! A payload for reading: pretty JSON, else text, else a hex dump, each bounded.

/// The letter's page shows at most this many bytes of a payload (the rest is downloaded).
pub(crate) const VIEW_MAX: usize = 64 * 1024;

/// A payload for reading: pretty JSON, else text, else a hex dump, each bounded (a text or
/// JSON payload over [`VIEW_MAX`] shows its first bytes as text, then how many more).
pub(super) fn payload(bytes: &[u8]) -> (&'static str, String) {
    const HEX_MAX: usize = 4_096;
    if bytes.len() > VIEW_MAX {
        let head = &bytes[..VIEW_MAX];
        let text = match std::str::from_utf8(head) {
            Ok(t) => Some(t),
            // Cut inside a character: the whole characters before it.
            Err(e) if e.error_len().is_none() => std::str::from_utf8(&head[..e.valid_up_to()]).ok(),
            Err(_) => None,
        };
        if let Some(t) = text {
            let more = bytes.len() - t.len();
            return (
                "text, the beginning",
                format!("{t}\n… {more} bytes more (download the payload for every byte)\n"),
            );
        }
    }
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(bytes)
        && let Ok(pretty) = serde_json::to_string_pretty(&v)
    {
        return ("JSON", pretty);
    }
    if let Ok(s) = std::str::from_utf8(bytes) {
        return ("text", s.to_owned());
    }
    let mut out = String::new();
    for (n, chunk) in bytes[..bytes.len().min(HEX_MAX)].chunks(16).enumerate() {
        let hex: Vec<String> = chunk.iter().map(|b| format!("{b:02x}")).collect();
        let ascii: String = chunk
            .iter()
            .map(|b| {
                if b.is_ascii_graphic() || *b == b' ' {
                    *b as char
                } else {
                    '.'
                }
            })
            .collect();
        out.push_str(&format!(
            "{:08x}  {:<47}  |{ascii}|\n",
            n * 16,
            hex.join(" ")
        ));
    }
    if bytes.len() > HEX_MAX {
        out.push_str(&format!(
            "… {} bytes more (download the payload for every byte)\n",
            bytes.len() - HEX_MAX
        ));
    }
    ("binary, shown as hex", out)
}

#[cfg(test)]
mod tests {
    use super::payload;

    #[test]
    fn payloads_read_as_json_text_or_hex() {
        assert_eq!(
            payload(br#"{"a":1}"#),
            ("JSON", "{\n  \"a\": 1\n}".to_owned())
        );
        assert_eq!(payload(b"plain"), ("text", "plain".to_owned()));
        let (what, hex) = payload(&[0xff, 0x00, b'A']);
        assert_eq!(what, "binary, shown as hex");
        assert!(hex.starts_with("00000000  ff 00 41"), "{hex}");
        assert!(hex.contains("|..A|"), "{hex}");
    }
}
