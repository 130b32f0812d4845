//! An exec plugin's stdout for `describe`, `steps` and `execute`, and its stderr progress
//! lines. Whatever a plugin prints, the adapter returns a value or an error naming the plugin;
//! a step result it accepts must be one the controller accepts in a heartbeat.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rivet_hardware_managers::plugin::{
    parse_describe, parse_execute_output, parse_progress, parse_steps,
};
use rivet_protocol::agent::HeartbeatRequest;
use rivet_protocol::limits::{parse_strict, Limits};
use serde_json::json;

fuzz_target!(|data: &[u8]| {
    let Some((&which, out)) = data.split_first() else {
        return;
    };
    match which % 4 {
        0 => match parse_describe("fuzz-plugin", out) {
            Ok(d) => assert!(!d.name.trim().is_empty()),
            Err(e) => assert!(e.to_string().starts_with("plugin fuzz-plugin: ")),
        },
        1 => {
            if let Err(e) = parse_steps("fuzz-plugin", out) {
                assert!(e.to_string().starts_with("plugin fuzz-plugin: `steps`"));
            }
        }
        2 => match parse_execute_output("fuzz-plugin", "execute s", out) {
            Ok(result) => {
                let hb = json!({"agent_version": "1", "results": [
                    {"id": "c1", "name": "execute_step", "status": "SUCCEEDED", "result": result}
                ]})
                .to_string();
                if let Err(e) =
                    parse_strict::<HeartbeatRequest>(hb.as_bytes(), &Limits::AGENT_HEARTBEAT)
                {
                    panic!("a step result the agent accepts is refused in a heartbeat: {e}");
                }
            }
            Err(e) => assert!(e.to_string().starts_with("plugin fuzz-plugin: `execute s`")),
        },
        _ => {
            let text = String::from_utf8_lossy(out);
            for line in text.lines() {
                if let Some((n, m, msg)) = parse_progress(line) {
                    let again = if msg.is_empty() {
                        format!("progress {n}/{m}")
                    } else {
                        format!("progress {n}/{m} {msg}")
                    };
                    assert_eq!(parse_progress(&again), Some((n, m, msg)));
                }
            }
        }
    }
});
