//! `hookscope serve`: the model behind a local HTTP API (`crates/serve`), until Ctrl-C or
//! SIGTERM.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Args;
use hookscope::{Error, Result};
use hookscope_serve::{Limits, ServeOptions};

/// Arguments of `hookscope serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    model: crate::model_arg::ModelArg,
    /// Where to listen; any address but a loopback one needs --token.
    #[arg(long, default_value = "127.0.0.1:7878")]
    addr: SocketAddr,
    /// The bearer token every request must carry (`Authorization: Bearer TOKEN`).
    #[arg(long)]
    token: Option<String>,
    /// Most prompts in one request.
    #[arg(long, default_value_t = Limits::default().prompts)]
    max_prompts: usize,
    /// Most tokens in one prompt.
    #[arg(long, default_value_t = Limits::default().prompt_tokens)]
    max_prompt_tokens: usize,
    /// Most new tokens one generation may ask for.
    #[arg(long, default_value_t = Limits::default().new_tokens)]
    max_new_tokens: usize,
    /// Most MiB the saved values of one request may hold.
    #[arg(long, default_value_t = Limits::default().saved_bytes >> 20)]
    max_saved_mib: usize,
    /// Largest request body, in KiB.
    #[arg(long, default_value_t = Limits::default().body_bytes >> 10)]
    max_body_kib: usize,
    /// Most patched runs (sites x positions) of one patching sweep.
    #[arg(long, default_value_t = Limits::default().patch_rows)]
    max_patch_runs: usize,
    /// Longest a request may take, in seconds, queueing included.
    #[arg(long, default_value_t = Limits::default().request_time.as_secs())]
    timeout: u64,
}

impl ServeArgs {
    fn limits(&self) -> Result<Limits> {
        let mib = |value: usize, unit: u32, flag: &str| {
            value.checked_mul(1 << unit).ok_or_else(|| {
                Error::InvalidInput(format!("--{flag} {value} is more than this machine holds"))
            })
        };
        Ok(Limits {
            body_bytes: mib(self.max_body_kib, 10, "max-body-kib")?,
            prompts: self.max_prompts,
            prompt_tokens: self.max_prompt_tokens,
            new_tokens: self.max_new_tokens,
            saved_bytes: mib(self.max_saved_mib, 20, "max-saved-mib")?,
            patch_rows: self.max_patch_runs,
            request_time: Duration::from_secs(self.timeout),
            ..Limits::default()
        })
    }
}

/// Loads the model and serves it.
pub fn serve(args: &ServeArgs) -> Result<()> {
    let options = ServeOptions {
        addr: args.addr,
        token: args.token.clone(),
        limits: args.limits()?,
    };
    options.check().map_err(Error::InvalidInput)?;
    let model = args.model.load()?;
    let spec = args.model.spec();
    hookscope_serve::run(model, options, |addr| {
        eprintln!("serving {spec} on http://{addr}/ (the API under /v1/; Ctrl-C stops)");
    })
    .map_err(Error::InvalidInput)
}
