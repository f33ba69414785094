// The request handler of an agent without a master: every request other than Ping is answered
// MASTER_UNAVAILABLE per key. Replaced by the request pipeline once the master link exists.
#pragma once

#include "kvagent/agent/request_handler.h"

namespace kvagent::agent {

class NoMasterHandler final : public RequestHandler {
 public:
  void Handle(ClientRequest request, CompletionSink& sink) override;
  void OnClientGone(ClientId) override {}
};

}  // namespace kvagent::agent
