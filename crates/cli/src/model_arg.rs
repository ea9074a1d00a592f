//! The MODEL argument every model command takes.

use clap::Args;
use hookscope::prelude::*;

/// Which model a command runs on.
#[derive(Debug, Args)]
pub struct ModelArg {
    /// A local Hugging Face directory or a hub id (see MODEL below); omitted: the embedded
    /// default model.
    #[arg(value_name = "MODEL")]
    model: Option<String>,
}

impl ModelArg {
    /// The model as the user named it (`<embedded default>` when omitted).
    pub fn spec(&self) -> String {
        self.model
            .clone()
            .unwrap_or_else(|| "<embedded default>".to_string())
    }

    /// Loads the model on the default device, printing what the adapter noted about the load.
    pub fn load(&self) -> Result<Model> {
        let source = match &self.model {
            Some(spec) => ModelSource::resolve(spec)?,
            None => hookscope::default_model(),
        };
        let model = Model::load(&source, &Device::default())?;
        for note in &model.load_report().notes {
            eprintln!("note: {note}");
        }
        Ok(model)
    }
}
