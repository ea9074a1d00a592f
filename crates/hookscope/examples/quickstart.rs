use hookscope::prelude::*;

fn main() -> hookscope::Result<()> {
    // The CPU; `"vulkan:0".parse::<DeviceChoice>()?.open()?` in a build with that feature.
    let device = DeviceChoice::Cpu.open()?;
    // The embedded demo model; a local Hugging Face directory or a hub id loads the same way:
    // `Model::load(&ModelSource::resolve("path/to/gpt2")?, &device)?`.
    let model = Model::load(&hookscope::default_model(), &device)?;
    let batch = model.encode(&["The Eiffel Tower is in the city of"])?;
    let keys = model
        .layout()
        .resolve("layers.1.self_attn.attention_keys")?;
    let requests = Interventions::new().save(keys, Steps::At(1)).zero(
        model.layout().resolve("layers.1.layer_output")?,
        Steps::At(1),
    );
    let mut config = model.generation_config().clone();
    config.max_new_tokens = 3;
    let run = model.generate(&batch, &requests, &config)?;
    // [B, NKV, prompt_len + 1, D]: the whole cache after step 1's append.
    let keys_at_step_1 = run.saved.get(keys, 1).expect("saved at step 1");
    assert_eq!(keys_at_step_1.shape(), [1, 2, batch.len() + 1, 16]);
    println!("new tokens: {:?}", run.new_tokens(0));
    Ok(())
}
