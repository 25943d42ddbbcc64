//! `GET /api/v1/flight-recorder`: the flight records of the communicator ranks of the process that answers, as
//! one JSON document, read on request (no signal, no file). occl-ras knows nothing of the flight recorder: the
//! library registers a renderer once ([`set_flight_provider`]); without one the route answers 404.

use std::sync::{Arc, OnceLock};

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

/// Writes the process's flight records (a JSON document) into the string.
pub type FlightProvider = Arc<dyn Fn(&mut String) + Send + Sync>;

static PROVIDER: OnceLock<FlightProvider> = OnceLock::new();

/// Registers the renderer of `/api/v1/flight-recorder`; the first registration stays.
pub fn set_flight_provider(p: FlightProvider) {
    let _ = PROVIDER.set(p);
}

pub(crate) async fn flight_recorder() -> Response {
    let Some(p) = PROVIDER.get().cloned() else {
        return (StatusCode::NOT_FOUND, "this process has no flight recorder\n").into_response();
    };
    // Reading the rings never blocks their writers, but a large ring takes a while to render.
    let body = tokio::task::spawn_blocking(move || {
        let mut out = String::new();
        p(&mut out);
        out
    })
    .await;
    match body {
        Ok(b) => ([(header::CONTENT_TYPE, "application/json")], b).into_response(),
        Err(e) => {
            (StatusCode::INTERNAL_SERVER_ERROR, format!("rendering the flight records failed: {e}\n")).into_response()
        }
    }
}
