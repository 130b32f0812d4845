//! Who is looking at a UI page: the session's user, an API credential's holder, or with
//! `--no-auth` an anonymous admin.

use crate::api::{auth, sessions, AppState};
use axum::http::HeaderMap;
use rivet_model::config::Role;

/// The person behind a UI request.
#[derive(Debug, Clone)]
pub struct Viewer {
    /// User (or credential) name.
    pub name: String,
    /// Role.
    pub role: Role,
    /// The session's CSRF value (none without a session: `--no-auth` or API credentials).
    pub csrf: Option<String>,
}

/// The viewer of a request, if it is authenticated.
pub fn of(state: &AppState, headers: &HeaderMap) -> Option<Viewer> {
    if state.conductor.config.no_auth {
        return Some(Viewer {
            name: "anonymous".into(),
            role: Role::Admin,
            csrf: None,
        });
    }
    if let Some(id) = sessions::cookie_value(headers) {
        if let Some(user) = state.sessions.get(id) {
            return Some(Viewer {
                name: user.name,
                role: user.role,
                csrf: Some(user.csrf),
            });
        }
    }
    auth::check(state, headers).map(|c| Viewer {
        name: c.name,
        role: c.role,
        csrf: None,
    })
}
