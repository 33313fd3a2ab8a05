// DEP dispatch planning on the CPU: W ranks with random routes (and a rank with no tokens) plan, exchange their
// messages, receive, "run" their experts (a partial = sum over local routes of w * (expert + 1)) and send the
// partials back by the all-to-all's offsets; the combine must give every token the sum over all its routes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"
#include "runtime/dep_dispatch.h"

namespace ds::dep {
namespace {

TEST(DepDispatch, RoundTripGivesEveryTokenAllItsRoutes) {
  for (int W : {1, 2, 3, 4, 8}) {
    const int K = 4, EL = 3, E = W * EL;
    std::mt19937 rng(W);
    std::vector<int> T(W);
    std::vector<std::vector<int32_t>> ids(W);
    std::vector<std::vector<float>> w(W);
    std::vector<Dispatch> dp(W);
    std::vector<std::string> msgs(W);
    for (int r = 0; r < W; ++r) {
      T[r] = r == W - 1 && W > 1 ? 0 : static_cast<int>(rng() % 9) + 1;  // the last rank is idle
      for (int t = 0; t < T[r]; ++t) {
        std::vector<int> pick;
        while (static_cast<int>(pick.size()) < std::min(K, E)) {  // distinct experts, like top-k
          const int e = static_cast<int>(rng() % E);
          if (std::find(pick.begin(), pick.end(), e) == pick.end()) pick.push_back(e);
        }
        for (int k = 0; k < K; ++k) {
          ids[r].push_back(pick[k % pick.size()]);
          w[r].push_back(0.1f * static_cast<float>(rng() % 10 + 1));
        }
      }
      dp[r] = plan_dispatch(ids[r].data(), w[r].data(), T[r], K, W, EL);
      msgs[r] = dp[r].message;
    }
    // Each receiver's partials, returned into every source's "back" buffer at that source's send offsets.
    std::vector<std::vector<double>> back(W);
    for (int r = 0; r < W; ++r) back[r].assign(dp[r].send_idx.size(), std::nan(""));
    for (int me = 0; me < W; ++me) {
      const Received rc = parse_received(msgs, me, W, K);
      for (int src = 0; src < W; ++src) {
        ASSERT_EQ(rc.rows[src], dp[src].send_rows[me]) << W << " " << src << "->" << me;
        for (size_t i = 0; i < rc.rows[src]; ++i) {
          const size_t row = rc.off[src] + i;
          // The route row is the source token's.
          const int32_t t = dp[src].send_idx[dp[src].send_off[me] + i];
          double partial = 0;
          bool any = false;
          for (int k = 0; k < K; ++k) {
            EXPECT_EQ(rc.ids[row * K + k], ids[src][t * K + k]);
            const int e = rc.ids[row * K + k];
            if (e / EL != me) continue;  // another rank's expert: dropped here
            any = true;
            partial += rc.weights[row * K + k] * (e + 1);
          }
          EXPECT_TRUE(any) << "a row sent to a rank holding none of its experts";
          back[src][dp[src].send_off[me] + i] = partial;
        }
      }
    }
    for (int r = 0; r < W; ++r)
      for (int t = 0; t < T[r]; ++t) {
        double want = 0, got = 0;
        for (int k = 0; k < K; ++k) want += w[r][t * K + k] * (ids[r][t * K + k] + 1);
        for (int p = 0; p < W; ++p) {
          const int32_t row = dp[r].comb_idx[static_cast<size_t>(t) * W + p];
          if (row >= 0) got += back[r].at(row);
        }
        EXPECT_NEAR(got, want, 1e-9) << "W " << W << " rank " << r << " token " << t;
      }
  }
}

TEST(DepDispatch, RefusesBadInput) {
  const int32_t ids[2] = {0, 7};
  const float w[2] = {1, 1};
  EXPECT_THROW(plan_dispatch(ids, w, 1, 2, 2, 3), Error);  // expert 7 outside 2 x 3
  const Dispatch d = plan_dispatch(ids, w, 1, 1, 2, 3);
  EXPECT_THROW(parse_received({d.message}, 0, 2, 1), Error);  // one message for two ranks
  EXPECT_THROW(parse_received({d.message, d.message.substr(0, 3)}, 0, 2, 1), Error);  // truncated
}

}  // namespace
}  // namespace ds::dep
