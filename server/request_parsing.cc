#include "server/request_parsing.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace replayd {

namespace {

// Rewrites the status of a sync call whose one request did not parse. gRPC shows it as the
// received message being null, then sends INTERNAL without running the handler.
class ParseErrorInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit ParseErrorInterceptor(grpc::experimental::ServerRpcInfo* info) : info_(info) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    using grpc::experimental::InterceptionHookPoints;
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE) &&
        methods->GetRecvMessage() == nullptr)
      unparsed_ = true;
    if (unparsed_ && methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS) &&
        methods->GetSendStatus().error_code() == grpc::StatusCode::INTERNAL) {
      const google::protobuf::MethodDescriptor* method = FindMethod(info_->method());
      if (method != nullptr) {
        const absl::Status error = ParseError(*method);
        methods->ModifySendStatus(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, std::string(error.message())));
      }
    }
    methods->Proceed();
  }

 private:
  grpc::experimental::ServerRpcInfo* const info_;
  bool unparsed_ = false;
};

class ParseErrorInterceptorFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(grpc::experimental::ServerRpcInfo* info) override {
    // A stream that ends also shows a null message: only calls that receive exactly one
    // request can tell a request that did not parse.
    using Type = grpc::experimental::ServerRpcInfo::Type;
    if (info->type() != Type::UNARY && info->type() != Type::SERVER_STREAMING) return nullptr;
    return new ParseErrorInterceptor(info);
  }
};

}  // namespace

const google::protobuf::MethodDescriptor* FindMethod(absl::string_view path) {
  if (absl::StartsWith(path, "/")) path.remove_prefix(1);
  return google::protobuf::DescriptorPool::generated_pool()->FindMethodByName(
      absl::StrReplaceAll(path, {{"/", "."}}));
}

absl::Status ParseError(const google::protobuf::MethodDescriptor& method) {
  return absl::InvalidArgumentError(absl::StrCat(method.service()->full_name(), "/", method.name(),
                                                 ": the request does not parse as a ",
                                                 method.input_type()->full_name()));
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> ParseErrorAnswers() {
  return std::make_unique<ParseErrorInterceptorFactory>();
}

}  // namespace replayd
