// One visitor from several lambdas, for std::visit over a variant.
#pragma once

namespace beaconkv {

template <class... Ts>
struct Overloaded : Ts... {
  using Ts::operator()...;
};
// Clang 14 does not deduce aggregate template arguments yet (the TSan and fuzz builds).
template <class... Ts>
Overloaded(Ts...) -> Overloaded<Ts...>;

}  // namespace beaconkv
