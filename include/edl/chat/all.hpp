// edl/chat/all.hpp: umbrella of the chat layer (Jinja chat templates, conversations).
#pragma once
#include <edl/chat/chat_template.hpp>
#include <edl/chat/conversation.hpp>
#include <edl/chat/jinja.hpp>
