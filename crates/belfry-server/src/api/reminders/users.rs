//! One user across reminders: `GET /v1/users/{user}/subscriptions` lists the reminders they
//! are subscribed to, `DELETE` ends every one of their subscriptions.

use axum::extract::State;
use axum::Json;
use serde::Serialize;

use super::{blocking, AppState, ReminderView, UserPath};
use crate::api::error::ApiError;

#[derive(Debug, Serialize)]
pub(super) struct SubscriptionsView {
    user: String,
    reminders: Vec<ReminderView>,
    /// The user has more subscriptions than one answer lists (10,000).
    truncated: bool,
}

pub(super) async fn subscriptions(
    State(state): State<AppState>,
    UserPath(user): UserPath,
) -> Result<Json<SubscriptionsView>, ApiError> {
    let shown = user.to_string();
    let found = blocking(&state, move |s| s.service.subscriptions_of(&user)).await?;
    Ok(Json(SubscriptionsView {
        user: shown,
        reminders: found
            .reminders
            .iter()
            .map(|r| ReminderView::of(r, None))
            .collect(),
        truncated: found.truncated,
    }))
}

pub(super) async fn unsubscribe_everywhere(
    State(state): State<AppState>,
    UserPath(user): UserPath,
) -> Result<Json<serde_json::Value>, ApiError> {
    let (removed, user) = blocking(&state, move |s| {
        let removed = s.service.unsubscribe_everywhere(&user)?;
        Ok((removed, user))
    })
    .await?;
    state.forget_users([&user]);
    tracing::info!(user = %user, subscriptions = removed, "user unsubscribed from every reminder");
    Ok(Json(serde_json::json!({ "unsubscribed": removed })))
}
