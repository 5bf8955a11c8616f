//! The routes: each path to its page's handler, every request through the guard.

use std::sync::Arc;

use axum::Router;
use axum::routing::{get, post};
use stagedoor_jobs::broker::Records;
use stagedoor_jobs::{Activity, DeadLetters};

use crate::builder::Dashboard;
use crate::data::App;
use crate::guard::guard;
use crate::pages;

impl<B> Dashboard<B>
where
    B: DeadLetters + Activity + Records + Clone + Send + Sync + 'static,
{
    /// The dashboard as an axum [`Router`], to serve alone or to mount in an app with
    /// `app.nest_service("/jobs", dashboard.router())`: its links work at any mount point, and
    /// `nest_service` serves the page at `/jobs/` too (axum's `nest` serves `/jobs` and
    /// `/jobs/dead`, but answers 404 at `/jobs/`). Serve the app with
    /// `into_make_service_with_connect_info::<SocketAddr>()` so that failed sign-ins are
    /// counted per client (without it every client counts as one).
    pub fn router(&self) -> Router {
        let app = Arc::new(App::new(self.clone()));
        Router::new()
            .route("/", get(pages::queues::page::<B>))
            .route("/api/queues", get(pages::queues::json::<B>))
            .route("/dead", get(pages::dead::list::<B>))
            .route("/dead/letter", get(pages::dead::letter::<B>))
            .route("/dead/confirm", get(pages::dead::confirm::<B>))
            .route("/dead/action", post(pages::dead::action::<B>))
            .route("/dead/payload", get(pages::dead::download::<B>))
            .route("/scheduled", get(pages::scheduled::page::<B>))
            .route("/workers", get(pages::workers::page::<B>))
            .route("/api/workers", get(pages::workers::json::<B>))
            .route("/flows", get(pages::flows::page::<B>))
            .route("/flows/{id}", get(pages::flows::by_path::<B>))
            .route("/jobs/result", get(pages::result::page::<B>))
            .route("/jobs/result/download", get(pages::result::download::<B>))
            .route("/jobs/{id}/result", get(pages::result::by_path::<B>))
            .route("/api/result", get(pages::result::json::<B>))
            .route(
                "/login",
                get(pages::login::page::<B>).post(pages::login::submit::<B>),
            )
            .route("/logout", post(pages::login::logout::<B>))
            .route("/assets/style.css", get(pages::assets::css))
            .route("/assets/live.js", get(pages::assets::js))
            .fallback(pages::refusal::not_found::<B>)
            .layer(axum::middleware::from_fn_with_state(
                app.clone(),
                guard::<B>,
            ))
            .with_state(app)
    }
}
