//! Firmware over Redfish: `firmware.update` starts `UpdateService.SimpleUpdate` for each
//! image and polls the returned task (task monitor from `Location`, or the Task resource
//! from the body) until it completes or fails. The step is not abortable: a firmware flash
//! must never be interrupted.

use super::Ctx;
use crate::DriverError;
use rivet_protocol::steps::{ArgInfo, StepDescriptor};
use serde_json::{json, Map, Value};
use std::time::{Duration, Instant};

const STEP: &str = "firmware.update";

/// One image to flash.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Image {
    pub(crate) url: String,
    /// Optional `Targets` (inventory URIs the update applies to).
    pub(crate) targets: Vec<String>,
}

/// `firmware.update`: manual only, never abortable, reboot afterwards.
pub(crate) fn update_descriptor() -> StepDescriptor {
    let mut argsinfo = std::collections::BTreeMap::new();
    argsinfo.insert(
        "firmware_images".to_string(),
        ArgInfo {
            description: "images to flash in order: a list of {\"url\": ..., \"targets\"?: [...]} (or give image_url)".into(),
            required: false,
        },
    );
    argsinfo.insert(
        "image_url".to_string(),
        ArgInfo {
            description: "one image URL (short form of firmware_images)".into(),
            required: false,
        },
    );
    StepDescriptor {
        interface: "firmware".into(),
        step: "update".into(),
        priority: 0,
        abortable: false,
        argsinfo,
        reboot_requested: true,
        requires_ramdisk: false,
    }
}

fn bad_args(reason: impl Into<String>) -> DriverError {
    DriverError::BadStepArgs {
        step: STEP.into(),
        reason: reason.into(),
    }
}

fn check_url(url: &str, what: &str) -> Result<String, DriverError> {
    let ok = reqwest::Url::parse(url)
        .map(|u| {
            matches!(
                u.scheme(),
                "http" | "https" | "ftp" | "sftp" | "tftp" | "nfs"
            )
        })
        .unwrap_or(false);
    if ok {
        Ok(url.to_string())
    } else {
        Err(bad_args(format!(
            "{what} {url:?} is not an http(s)/ftp/tftp/nfs URL"
        )))
    }
}

/// `firmware_images: [{url, targets?}]` or `image_url`.
pub(crate) fn parse_images(args: &Map<String, Value>) -> Result<Vec<Image>, DriverError> {
    if let Some(list) = args.get("firmware_images") {
        let list = list.as_array().filter(|l| !l.is_empty()).ok_or_else(|| {
            bad_args("argument \"firmware_images\" must be a non-empty list of {\"url\": ...}")
        })?;
        return list
            .iter()
            .enumerate()
            .map(|(i, item)| {
                let url = item["url"].as_str().ok_or_else(|| {
                    bad_args(format!("firmware_images[{i}] has no \"url\" string"))
                })?;
                let targets = item["targets"]
                    .as_array()
                    .map(|t| {
                        t.iter()
                            .filter_map(|x| x.as_str().map(str::to_string))
                            .collect()
                    })
                    .unwrap_or_default();
                Ok(Image {
                    url: check_url(url, &format!("firmware_images[{i}].url"))?,
                    targets,
                })
            })
            .collect();
    }
    match args.get("image_url").and_then(Value::as_str) {
        Some(url) => Ok(vec![Image {
            url: check_url(url, "image_url")?,
            targets: Vec::new(),
        }]),
        None => Err(bad_args(
            "give \"firmware_images\" (a list of {\"url\": ...}) or \"image_url\"",
        )),
    }
}

/// The SimpleUpdate action: its target and its description (allowable values).
async fn simple_update(ctx: &Ctx) -> Result<(String, Value), DriverError> {
    let root = ctx.client.get("/redfish/v1/").await?;
    let unsupported = || DriverError::Unsupported {
        driver: "redfish".into(),
        operation: format!(
            "firmware update: the BMC at {} has no UpdateService.SimpleUpdate",
            ctx.client.address()
        ),
    };
    let svc_path = root["UpdateService"]["@odata.id"]
        .as_str()
        .ok_or_else(unsupported)?;
    let svc = ctx.client.get(svc_path).await?;
    let action = svc["Actions"]["#UpdateService.SimpleUpdate"].clone();
    let target = action["target"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| format!("{svc_path}/Actions/UpdateService.SimpleUpdate"));
    Ok((target, action))
}

/// Start one update; the URL to poll, if the BMC runs it as a task.
async fn start(
    ctx: &Ctx,
    target: &str,
    action: &Value,
    image: &Image,
) -> Result<Option<String>, DriverError> {
    let mut body = json!({ "ImageURI": image.url });
    if !image.targets.is_empty() {
        body["Targets"] = json!(image.targets);
    }
    if let Some(allowed) = action["TransferProtocol@Redfish.AllowableValues"].as_array() {
        let scheme = image
            .url
            .split(':')
            .next()
            .unwrap_or("")
            .to_ascii_uppercase();
        if allowed.iter().any(|v| v.as_str() == Some(scheme.as_str())) {
            body["TransferProtocol"] = scheme.into();
        }
    }
    let resp = ctx.client.post(target, &body).await?;
    let from_body = resp.body["@odata.id"]
        .as_str()
        .filter(|_| resp.body.get("TaskState").is_some())
        .or_else(|| resp.body["TaskMonitor"].as_str())
        .map(str::to_string);
    Ok(resp.location.or(from_body))
}

/// Where a task stands.
#[derive(Debug, PartialEq)]
enum TaskOutcome {
    Running(Option<u64>),
    Done(Vec<String>),
    Failed(String, Vec<String>),
}

fn task_messages(task: &Value) -> Vec<String> {
    task["Messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["Message"].as_str().map(str::to_string))
        .collect()
}

/// Read a Task body (`None`: no TaskState, i.e. the monitor returned the final result).
fn task_outcome(task: &Value) -> Option<TaskOutcome> {
    let state = task["TaskState"].as_str()?;
    let msgs = task_messages(task);
    Some(match state {
        "Completed" if task["TaskStatus"] == "Critical" => {
            TaskOutcome::Failed("Completed with TaskStatus Critical".into(), msgs)
        }
        "Completed" => TaskOutcome::Done(msgs),
        "Exception" | "Killed" | "Cancelled" | "Interrupted" => {
            TaskOutcome::Failed(state.to_string(), msgs)
        }
        _ => TaskOutcome::Running(task["PercentComplete"].as_u64()),
    })
}

/// Poll a task (monitor or resource) until it ends or `task_timeout_s` passes.
async fn wait_task(ctx: &Ctx, node: &str, url: &str) -> Result<Vec<String>, DriverError> {
    let limit = Duration::from_secs(ctx.cfg.task_timeout_s.max(1));
    let deadline = Instant::now() + limit;
    loop {
        let resp = ctx.client.get_response(url).await?;
        let outcome = match (resp.status, task_outcome(&resp.body)) {
            (_, Some(o)) => o,
            (202, None) => TaskOutcome::Running(None),
            // 200 without a Task body or 204: the monitor is done.
            (_, None) => TaskOutcome::Done(Vec::new()),
        };
        match outcome {
            TaskOutcome::Done(msgs) => return Ok(msgs),
            TaskOutcome::Failed(state, msgs) => {
                return Err(DriverError::Bmc(format!(
                    "firmware update task {url} on the BMC at {} ended {state}: {}",
                    ctx.client.address(),
                    if msgs.is_empty() {
                        "no message".to_string()
                    } else {
                        msgs.join("; ")
                    }
                )))
            }
            TaskOutcome::Running(pct) => {
                tracing::debug!(node = %node, task = %url, percent = pct, "firmware update running");
            }
        }
        if Instant::now() >= deadline {
            return Err(DriverError::Bmc(format!(
                "firmware update task {url} on the BMC at {} did not finish in {} s",
                ctx.client.address(),
                limit.as_secs()
            )));
        }
        ctx.pause().await;
    }
}

/// Flash every image in order; each runs to completion before the next starts.
pub(crate) async fn update(ctx: &Ctx, node: &str, images: &[Image]) -> Result<Value, DriverError> {
    let (target, action) = simple_update(ctx).await?;
    let mut results = Vec::new();
    for image in images {
        tracing::info!(node = %node, image = %image.url, "firmware update: starting");
        let task = start(ctx, &target, &action, image).await?;
        let messages = match &task {
            Some(url) => wait_task(ctx, node, url).await?,
            None => Vec::new(),
        };
        tracing::info!(node = %node, image = %image.url, "firmware update: done");
        results.push(json!({"url": image.url, "task": task, "messages": messages}));
    }
    Ok(json!({ "firmware_images": results, "reboot_required": true }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn image_args() {
        let list = parse_images(&args(json!({"firmware_images": [
            {"url": "http://10.0.0.1/bmc.bin", "targets": ["/redfish/v1/UpdateService/FirmwareInventory/BMC"]},
            {"url": "https://10.0.0.1/bios.bin"}
        ]})))
        .expect("valid");
        assert_eq!(list.len(), 2);
        assert_eq!(list[0].targets.len(), 1);
        let one = parse_images(&args(json!({"image_url": "http://x/fw.bin"}))).expect("valid");
        assert_eq!(one[0].url, "http://x/fw.bin");
        for bad in [
            json!({}),
            json!({"firmware_images": []}),
            json!({"firmware_images": [{"uri": "http://x"}]}),
            json!({"image_url": "file:///etc/passwd"}),
        ] {
            assert!(
                matches!(
                    parse_images(&args(bad.clone())),
                    Err(DriverError::BadStepArgs { .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn task_states() {
        assert_eq!(
            task_outcome(&json!({"TaskState": "Running", "PercentComplete": 40})),
            Some(TaskOutcome::Running(Some(40)))
        );
        assert_eq!(
            task_outcome(
                &json!({"TaskState": "Completed", "TaskStatus": "OK", "Messages": [{"Message": "done"}]})
            ),
            Some(TaskOutcome::Done(vec!["done".into()]))
        );
        assert!(matches!(
            task_outcome(&json!({"TaskState": "Exception", "Messages": [{"Message": "bad image"}]})),
            Some(TaskOutcome::Failed(_, m)) if m == vec!["bad image".to_string()]
        ));
        assert!(matches!(
            task_outcome(&json!({"TaskState": "Completed", "TaskStatus": "Critical"})),
            Some(TaskOutcome::Failed(..))
        ));
        assert_eq!(task_outcome(&json!({})), None);
    }
}
