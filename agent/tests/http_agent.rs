//! The agent over real HTTP against a tiny scripted controller (tokio TcpListener and just
//! enough HTTP/1.1): paths, bearer token, lookup fail-over, command → result → ack.
#![allow(clippy::unwrap_used)]

use rivet_agent::inventory::InventoryOptions;
use rivet_agent::{
    Agent, AgentOptions, BackoffConfig, Executor, ExecutorOptions, HttpTransport, LogRing,
};
use rivet_hardware_managers::Dispatcher;
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

/// (method path, Authorization header, JSON body) → (status, JSON answer).
type Handler = Arc<dyn Fn(&str, Option<&str>, &Value) -> (u16, Value) + Send + Sync>;

/// Serve `handler` on a fresh loopback port; one request per connection.
async fn fake_controller(handler: Handler) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let handler = handler.clone();
            tokio::spawn(async move {
                let mut reader = BufReader::new(stream);
                let mut request_line = String::new();
                reader.read_line(&mut request_line).await.unwrap();
                let (mut len, mut auth) = (0usize, None);
                loop {
                    let mut line = String::new();
                    reader.read_line(&mut line).await.unwrap();
                    let line = line.trim_end();
                    if line.is_empty() {
                        break;
                    }
                    if let Some((k, v)) = line.split_once(':') {
                        match k.to_ascii_lowercase().as_str() {
                            "content-length" => len = v.trim().parse().unwrap(),
                            "authorization" => auth = Some(v.trim().to_string()),
                            _ => {}
                        }
                    }
                }
                let mut body = vec![0u8; len];
                reader.read_exact(&mut body).await.unwrap();
                let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                let mut parts = request_line.split_whitespace();
                let what = format!("{} {}", parts.next().unwrap(), parts.next().unwrap());
                let (status, answer) = handler(&what, auth.as_deref(), &body);
                let answer = answer.to_string();
                let resp = format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n\
                     content-length: {}\r\nconnection: close\r\n\r\n{answer}",
                    answer.len()
                );
                let mut stream = reader.into_inner();
                let _ = stream.write_all(resp.as_bytes()).await;
            });
        }
    });
    format!("http://{addr}")
}

#[derive(Default)]
struct Script {
    lookups: usize,
    beats: Vec<(Option<String>, Value)>,
    stored: Vec<Value>,
}

const TOKEN: &str = "0123456789abcdef0123456789abcdef";

#[tokio::test]
async fn lookup_heartbeat_command_result_ack_over_http() {
    let script = Arc::new(Mutex::new(Script::default()));
    let s = script.clone();
    let handler: Handler = Arc::new(move |what, auth, body| {
        let mut s = s.lock().unwrap();
        match what {
            "POST /agent/v1/lookup" => {
                s.lookups += 1;
                assert!(body["agent_version"].is_string());
                // 404 first: unknown hardware is retried.
                if s.lookups == 1 {
                    return (404, json!({"error_message": "no such node"}));
                }
                (
                    200,
                    json!({
                        "node_uuid": "node-1",
                        "agent_token": TOKEN,
                        "config": {"long_poll_s": 1, "heartbeat_timeout_s": 300}
                    }),
                )
            }
            "POST /agent/v1/heartbeat/node-1" => {
                s.beats.push((auth.map(str::to_string), body.clone()));
                let results = body["results"].as_array().cloned().unwrap_or_default();
                let acks: Vec<Value> = results.iter().map(|r| r["id"].clone()).collect();
                for r in results {
                    if !s.stored.iter().any(|x| x["id"] == r["id"]) {
                        s.stored.push(r);
                    }
                }
                let command = match s.beats.len() {
                    1 => json!({"id": "c1", "name": "get_clean_steps"}),
                    // A repeated id must not run again.
                    3 => json!({"id": "c1", "name": "get_clean_steps"}),
                    4 => json!({"id": "c2", "name": "execute_step",
                                "params": {"interface": "deploy", "step": "no_such_step"}}),
                    _ => Value::Null,
                };
                (200, json!({"command": command, "acks": acks}))
            }
            other => panic!("unexpected request {other}"),
        }
    });
    let good = fake_controller(handler).await;
    // A dead controller first: lookup must fail over to the live one.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };

    let dispatcher = Arc::new(Dispatcher::new(Vec::new()));
    let executor = Executor::new(
        dispatcher.clone(),
        ExecutorOptions::default(),
        LogRing::new(50, false),
    );
    let opts = AgentOptions {
        controllers: vec![dead, good],
        backoff: BackoffConfig {
            base: Duration::from_millis(5),
            cap: Duration::from_millis(20),
        },
        progress_interval: Duration::from_millis(20),
        min_interval: Duration::from_millis(20),
        inventory: InventoryOptions {
            skip_bmc: true,
            ..Default::default()
        },
        ..Default::default()
    };
    let agent = Agent::new(
        opts,
        HttpTransport::new(None).unwrap(),
        dispatcher,
        executor,
    );

    let s = script.clone();
    let done = async move {
        for _ in 0..500 {
            if s.lock().unwrap().stored.len() >= 2 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("no results stored");
    };
    tokio::time::timeout(Duration::from_secs(20), agent.run(done))
        .await
        .unwrap();

    let s = script.lock().unwrap();
    assert!(s.lookups >= 2);
    assert!(s
        .beats
        .iter()
        .all(|(auth, _)| auth.as_deref() == Some(&*format!("Bearer {TOKEN}"))));
    let ids: Vec<&str> = s.stored.iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert_eq!(ids, vec!["c1", "c2"]);
    assert_eq!(s.stored[0]["status"], "SUCCEEDED");
    assert_eq!(s.stored[0]["result"]["clean_steps"], json!([]));
    assert_eq!(s.stored[1]["status"], "FAILED");
    assert!(s.stored[1]["error"]
        .as_str()
        .unwrap()
        .contains("no_such_step"));
    assert!(s.stored[1]["log_tail"].is_string());
    // Each result was sent until acked, then never again.
    let sent_c1 = s
        .beats
        .iter()
        .filter(|(_, b)| b["results"].to_string().contains("\"c1\""))
        .count();
    assert_eq!(
        sent_c1, 1,
        "c1 is acked by the answer to the heartbeat that carried it"
    );
}
