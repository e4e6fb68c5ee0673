//! [`ChatTemplate`]: turns chat messages into the prompt text an engine tokenizes.
//!
//! Jinja templates are rendered the way `transformers` renders them (`trim_blocks` and
//! `lstrip_blocks` on, `loop_controls`, Python string methods, `raise_exception`), with
//! `messages`, `add_generation_prompt`, `tools`, `bos_token` and `eos_token` in the context. The
//! built-in template is plain Rust (see the crate docs for its exact format).

use std::sync::Arc;

use minijinja::{context, Environment, Error, ErrorKind};

use crate::{ChatMessage, TokenizerError};

/// Name of the single template inside the Jinja environment.
const TEMPLATE_NAME: &str = "chat_template";

/// A chat template. Cheap to clone, `Send + Sync`.
#[derive(Clone)]
pub struct ChatTemplate {
    kind: Kind,
}

#[derive(Clone)]
enum Kind {
    Builtin,
    Jinja {
        env: Arc<Environment<'static>>,
        bos: Option<String>,
        eos: Option<String>,
    },
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::Builtin => f.write_str("ChatTemplate::Builtin"),
            Kind::Jinja { .. } => f.write_str("ChatTemplate::Jinja"),
        }
    }
}

impl ChatTemplate {
    /// The built-in template documented in the crate docs.
    pub fn builtin() -> Self {
        Self {
            kind: Kind::Builtin,
        }
    }

    /// Compiles a Jinja chat template (e.g. a model's `chat_template.jinja`). `bos` and `eos` are
    /// the special-token strings exposed to the template as `bos_token` / `eos_token`.
    pub fn from_jinja(
        source: &str,
        bos: Option<String>,
        eos: Option<String>,
    ) -> Result<Self, TokenizerError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_template_owned(TEMPLATE_NAME, source.to_owned())
            .map_err(|e| TokenizerError::Template(e.to_string()))?;
        Ok(Self {
            kind: Kind::Jinja {
                env: Arc::new(env),
                bos,
                eos,
            },
        })
    }

    /// True for the built-in template.
    pub fn is_builtin(&self) -> bool {
        matches!(self.kind, Kind::Builtin)
    }

    /// Renders `messages`; with `add_generation_prompt` the text ends where the assistant's reply
    /// starts. `tools` is the request's `tools` array, passed to the template as is.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        tools: Option<&serde_json::Value>,
    ) -> Result<String, TokenizerError> {
        match &self.kind {
            Kind::Builtin => Ok(render_builtin(messages, add_generation_prompt, tools)),
            Kind::Jinja { env, bos, eos } => {
                let template = env
                    .get_template(TEMPLATE_NAME)
                    .map_err(|e| TokenizerError::Template(e.to_string()))?;
                let tools = tools.map(minijinja::Value::from_serialize);
                template
                    .render(context! {
                        messages => minijinja::Value::from_serialize(messages),
                        add_generation_prompt => add_generation_prompt,
                        tools => tools,
                        bos_token => bos.as_deref().unwrap_or(""),
                        eos_token => eos.as_deref().unwrap_or(""),
                    })
                    .map_err(|e| TokenizerError::Template(format!("{e:#}")))
            }
        }
    }
}

fn render_builtin(
    messages: &[ChatMessage],
    add_generation_prompt: bool,
    tools: Option<&serde_json::Value>,
) -> String {
    let content_len: usize = messages
        .iter()
        .map(|m| m.role.len() + m.content.len() + 12)
        .sum();
    let mut out = String::with_capacity(content_len + 16);
    if let Some(tools) = tools {
        out.push_str("<|tools|>\n");
        out.push_str(&tools.to_string());
        out.push_str("<|end|>\n");
    }
    for m in messages {
        out.push_str("<|");
        out.push_str(&m.role);
        out.push_str("|>\n");
        out.push_str(&m.content);
        out.push_str("<|end|>\n");
    }
    if add_generation_prompt {
        out.push_str("<|assistant|>\n");
    }
    out
}

/// `raise_exception(msg)`, which Hugging Face templates call to reject a conversation.
fn raise_exception(message: String) -> Result<String, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn msgs() -> Vec<ChatMessage> {
        vec![
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", "Hi"),
        ]
    }

    #[test]
    fn builtin_format() {
        let t = ChatTemplate::builtin();
        assert_eq!(
            t.render(&msgs(), true, None).unwrap(),
            "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\n"
        );
        assert_eq!(
            t.render(&msgs()[..1], false, Some(&json!([{"type": "function"}])))
                .unwrap(),
            "<|tools|>\n[{\"type\":\"function\"}]<|end|>\n<|system|>\nBe brief.<|end|>\n"
        );
    }

    #[test]
    fn builtin_conversation_is_prefix_of_continuation() {
        let t = ChatTemplate::builtin();
        let mut longer = msgs();
        longer.push(ChatMessage::new("assistant", "Hello."));
        let short = t.render(&msgs(), false, None).unwrap();
        let long = t.render(&longer, true, None).unwrap();
        assert!(long.starts_with(&short));
    }

    #[test]
    fn jinja_uses_transformers_whitespace_rules_and_python_methods() {
        let src = "{{ bos_token }}{% for m in messages %}\n  {% if m.role == 'system' %}[S]{{ m.content.strip() }}{% else %}[{{ m.role.upper() }}]{{ m.content }}{% endif %}\n{% endfor %}\n{% if add_generation_prompt %}[A]{% endif %}";
        let t = ChatTemplate::from_jinja(src, Some("<s>".into()), None).unwrap();
        let mut m = msgs();
        m[0].content = "  Be brief. ".into();
        assert_eq!(
            t.render(&m, true, None).unwrap(),
            "<s>[S]Be brief.[USER]Hi[A]"
        );
    }

    #[test]
    fn jinja_tools_and_loop_controls() {
        let src = "{% if tools %}{% for t in tools %}{{ t.name }};{% endfor %}{% endif %}{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.content }}{% endfor %}";
        let t = ChatTemplate::from_jinja(src, None, None).unwrap();
        let tools = json!([{"name": "a"}, {"name": "b"}]);
        assert_eq!(
            t.render(&msgs(), false, Some(&tools)).unwrap(),
            "a;b;Be brief."
        );
    }

    #[test]
    fn jinja_errors_are_typed() {
        assert!(matches!(
            ChatTemplate::from_jinja("{% for %}", None, None),
            Err(TokenizerError::Template(_))
        ));
        let t = ChatTemplate::from_jinja("{{ raise_exception('no system role') }}", None, None)
            .unwrap();
        let err = t.render(&msgs(), true, None).unwrap_err();
        assert!(err.to_string().contains("no system role"), "{err}");
    }
}
