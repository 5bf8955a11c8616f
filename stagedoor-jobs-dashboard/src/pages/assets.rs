//! The stylesheet and the script, embedded in the binary (no CDN: it works offline).

use axum::http::header;
use axum::response::IntoResponse;

const CSS: &str = include_str!("../../assets/style.css");
const JS: &str = include_str!("../../assets/live.js");

/// `assets/style.css`.
pub(crate) async fn css() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "public, max-age=300"),
        ],
        CSS,
    )
}

/// `assets/live.js`: refreshes the queues, workers and job result pages every 2 s from their
/// JSON.
pub(crate) async fn js() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::CACHE_CONTROL, "public, max-age=300"),
        ],
        JS,
    )
}
