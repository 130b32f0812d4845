//! Just enough of the W3C WebDriver protocol, over plain HTTP, to drive the system's headless
//! chromium through chromedriver in the web UI's tests (no WebDriver crate: a handful of
//! JSON calls with the blocking reqwest client the harness already has).

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The key under which WebDriver names an element.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// Debian's chromium and its WebDriver, when both are installed (scripts/setup-browser.sh).
pub fn installed() -> Option<(PathBuf, PathBuf)> {
    let browser = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())?;
    let driver = PathBuf::from("/usr/bin/chromedriver");
    driver.exists().then_some((browser, driver))
}

/// [`installed`] for a test: when missing, says why the test skips (a failure under
/// `RIVET_REQUIRE_PEERS=1`, see [`crate::prerequisite`]).
pub fn required() -> Option<(PathBuf, PathBuf)> {
    let found = installed();
    crate::prerequisite(
        found.is_some(),
        "chromium and chromedriver (scripts/setup-browser.sh)",
    );
    found
}

/// A headless chromium session, ended (and chromedriver stopped) on drop.
pub struct Browser {
    http: reqwest::blocking::Client,
    session: String,
    driver: Child,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Start chromedriver on a free port and open a headless session.
    pub fn start(browser: &std::path::Path, driver: &std::path::Path) -> Result<Browser> {
        let port = super::free_port()?;
        let driver = Command::new(driver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting chromedriver")?;
        let profile = tempfile::tempdir()?;
        let http = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()?;
        let base = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ready = http
                .get(format!("{base}/status"))
                .send()
                .ok()
                .and_then(|r| r.json::<Value>().ok())
                .is_some_and(|v| v["value"]["ready"] == true);
            if ready {
                break;
            }
            if Instant::now() > deadline {
                bail!("chromedriver did not answer on port {port}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": browser.display().to_string(),
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         "--window-size=1280,900", "--no-first-run",
                         format!("--user-data-dir={}", profile.path().display())],
            },
        }}});
        let resp: Value = http
            .post(format!("{base}/session"))
            .json(&caps)
            .send()?
            .json()?;
        let Some(id) = resp["value"]["sessionId"].as_str() else {
            bail!("chromedriver refused a session: {resp}");
        };
        Ok(Browser {
            http,
            session: format!("{base}/session/{id}"),
            driver,
            _profile: profile,
        })
    }

    fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Result<Value> {
        let mut req = self
            .http
            .request(method.clone(), format!("{}{path}", self.session));
        if let Some(b) = body {
            req = req.json(&b);
        } else if method == reqwest::Method::POST {
            req = req.json(&json!({}));
        }
        let resp = req
            .send()
            .with_context(|| format!("WebDriver {method} {path}"))?;
        let status = resp.status();
        let v: Value = resp.json().unwrap_or(Value::Null);
        if !status.is_success() {
            bail!("WebDriver {method} {path}: {status} {}", v["value"]);
        }
        Ok(v["value"].clone())
    }

    /// Load `url`.
    pub fn goto(&self, url: &str) -> Result<()> {
        self.call(reqwest::Method::POST, "/url", Some(json!({"url": url})))
            .map(|_| ())
    }

    /// The page's URL now.
    pub fn url(&self) -> Result<String> {
        Ok(self
            .call(reqwest::Method::GET, "/url", None)?
            .as_str()
            .unwrap_or_default()
            .to_string())
    }

    /// The first element matching `css`, if any.
    pub fn find(&self, css: &str) -> Result<Option<String>> {
        let found = self.call(
            reqwest::Method::POST,
            "/elements",
            Some(json!({"using": "css selector", "value": css})),
        )?;
        Ok(found
            .as_array()
            .and_then(|a| a.first())
            .and_then(|e| e[ELEMENT].as_str())
            .map(str::to_string))
    }

    /// Wait up to `timeout` for an element matching `css`.
    pub fn wait_for(&self, css: &str, timeout: Duration) -> Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(e) = self.find(css)? {
                return Ok(e);
            }
            if Instant::now() > deadline {
                bail!("no {css} within {timeout:?} on {}", self.url()?);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Click element `el`.
    pub fn click(&self, el: &str) -> Result<()> {
        self.call(reqwest::Method::POST, &format!("/element/{el}/click"), None)
            .map(|_| ())
    }

    /// Find the element matching `css` and click it, finding it again when the page redrew
    /// it in between (a live page replaces its elements when the node changes).
    pub fn click_css(&self, css: &str, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let el = self.wait_for(css, timeout)?;
            match self.click(&el) {
                Ok(()) => return Ok(()),
                Err(e) if e.to_string().contains("stale element") && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Type `text` into element `el`.
    pub fn type_into(&self, el: &str, text: &str) -> Result<()> {
        self.call(
            reqwest::Method::POST,
            &format!("/element/{el}/value"),
            Some(json!({"text": text})),
        )
        .map(|_| ())
    }

    /// Run `script` (a function body; `arguments` holds `args`) and return what it returns.
    pub fn script(&self, script: &str, args: Value) -> Result<Value> {
        self.call(
            reqwest::Method::POST,
            "/execute/sync",
            Some(json!({"script": script, "args": args})),
        )
    }

    /// Wait up to `timeout` until `script` returns `true`; fails with `what` and the last value.
    pub fn wait_until(
        &self,
        what: &str,
        script: &str,
        args: Value,
        timeout: Duration,
    ) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let v = self.script(script, args.clone())?;
            if v == true {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "{what}: not within {timeout:?} (last: {v}) on {}",
                    self.url()?
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A PNG of the viewport (WebDriver answers it as base64).
    pub fn screenshot(&self) -> Result<Vec<u8>> {
        use base64::Engine as _;
        let b64 = self.call(reqwest::Method::GET, "/screenshot", None)?;
        let b64 = b64.as_str().context("screenshot: no base64 string")?;
        Ok(base64::engine::general_purpose::STANDARD.decode(b64)?)
    }

    /// With `RIVET_SCREENSHOTS=DIR`, save the viewport as `DIR/<name>.png` (the README's
    /// pictures come from such a run); otherwise nothing, so CI never rewrites the repository.
    pub fn screenshot_to_env(&self, name: &str) -> Result<()> {
        let Some(dir) = std::env::var_os("RIVET_SCREENSHOTS") else {
            return Ok(());
        };
        let dir = PathBuf::from(dir);
        std::fs::create_dir_all(&dir)?;
        let png = self.screenshot()?;
        anyhow::ensure!(png.starts_with(b"\x89PNG"), "screenshot is not a PNG");
        std::fs::write(dir.join(format!("{name}.png")), png)?;
        Ok(())
    }

    /// The browser's cookies for the current page (HttpOnly ones included).
    pub fn cookies(&self) -> Result<Vec<Value>> {
        Ok(self
            .call(reqwest::Method::GET, "/cookie", None)?
            .as_array()
            .cloned()
            .unwrap_or_default())
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.http.delete(&self.session).send();
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
