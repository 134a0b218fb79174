// The formats rec-server shares with Python, against the golden files both test suites load
// (tests/data/*_golden.json, written once; Python's tests read the same): update records valid
// and refused with their reasons, row bytes, URLs and store keys, and requests to a context
// model accepted as the model's inputs or refused with the text both servers give.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "contract/row_bytes.h"
#include "contract/store_spec.h"
#include "contract/update_record.h"
#include "contract/zch_home.h"
#include "golden_file.h"
#include "model/model_spec.h"
#include "model/request.h"

namespace rec {
namespace {

using nlohmann::json;

using testing::Cases;
using testing::Contains;
using testing::Golden;

std::string Unhex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

std::string Hex(const std::string& bytes) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

// One case's stream entry: its fields as the entry holds them (binary ones unhexed).
StreamFields Entry(const json& c, const std::set<std::string>& binary) {
  StreamFields fields;
  for (const auto& [name, value] : c["fields"].items()) {
    const std::string v = value.get<std::string>();
    fields.emplace_back(name, binary.count(name) ? Unhex(v) : v);
  }
  return fields;
}

TEST(Golden, UpdateRecordsDecodeOrAreRefusedWithTheirReason) {
  const json g = Golden("update_record_golden.json");
  EXPECT_EQ(g.value("format", ""), kUpdateFormat);
  EXPECT_EQ(g["formats"], json({kUpdateFormatV1, kUpdateFormatV2, kUpdateFormat}));
  EXPECT_EQ(g.value("max_rows", int64_t{0}), kMaxUpdateRows);
  EXPECT_EQ(g.value("max_dim", int64_t{0}), kMaxUpdateDim);
  const std::set<std::string> binary = g.contains("binary_fields")
                                           ? g["binary_fields"].get<std::set<std::string>>()
                                           : std::set<std::string>{};
  for (const json& c : Cases(g, "valid")) {
    UpdateRecord r;
    Status st = DecodeUpdateRecord(Entry(c, binary), &r);
    ASSERT_TRUE(st.ok()) << c["name"] << ": " << st.message();
    const json& want = c["record"];
    EXPECT_EQ(r.run, want["run"].get<std::string>()) << c["name"];
    EXPECT_EQ(r.gen, want["gen"].get<int64_t>()) << c["name"];
    EXPECT_EQ(r.rank, want["rank"].get<int64_t>()) << c["name"];
    EXPECT_EQ(r.world, want["world"].get<int64_t>()) << c["name"];
    EXPECT_EQ(r.step, want["step"].get<int64_t>()) << c["name"];
    EXPECT_EQ(r.wall_ns, want["wall_ns"].get<int64_t>()) << c["name"];
    EXPECT_EQ(r.last, want["last"].get<bool>()) << c["name"];
    EXPECT_EQ(r.table, want["table"].get<std::string>()) << c["name"];
    EXPECT_EQ(r.dtype, want["dtype"].get<std::string>()) << c["name"];
    EXPECT_EQ(r.dim, want["dim"].get<int64_t>()) << c["name"];
    EXPECT_EQ(r.ids, want["ids"].get<std::vector<int64_t>>()) << c["name"];
    EXPECT_EQ(Hex(r.rows), want["rows"].get<std::string>()) << c["name"];
    for (const auto& [key, got] :
         {std::make_pair("evicted", &r.evicted), std::make_pair("admitted", &r.admitted)}) {
      std::vector<UpdateRecord::SlotId> pairs;
      for (const json& p : want.value(key, json::array())) {
        pairs.push_back({p[0].get<int64_t>(), p[1].get<int64_t>()});
      }
      EXPECT_EQ(*got, pairs) << c["name"] << " " << key;
    }
    EXPECT_EQ(r.has_held, want.contains("held")) << c["name"];
    std::vector<UpdateRecord::SlotId> held;
    for (const json& p : want.value("held", json::array())) {
      held.push_back({p[0].get<int64_t>(), p[1].get<int64_t>()});
    }
    EXPECT_EQ(r.held, held) << c["name"] << " held";
  }
  for (const json& c : Cases(g, "refused")) {
    UpdateRecord r;
    Status st = DecodeUpdateRecord(Entry(c, binary), &r);
    ASSERT_FALSE(st.ok()) << c["name"];
    EXPECT_TRUE(Contains(st, c["error"].get<std::string>()))
        << c["name"] << ": " << st.message() << "\n  want: " << c["error"];
  }
}

TEST(Golden, ZchHomeIsRecZchHome) {
  const json g = Golden("update_record_golden.json");
  for (const json& c : Cases(g, "zch_home")) {
    EXPECT_EQ(ZchHome(c["id"].get<int64_t>(), c["slots"].get<int64_t>()), c["home"].get<int64_t>())
        << c["id"] << " " << c["slots"];
  }
}

TEST(Golden, RowBytesOfEveryDtypeAndDimParity) {
  const json g = Golden("row_bytes_golden.json");
  for (const json& c : Cases(g, "rows")) {
    const std::string dtype = c["dtype"].get<std::string>();
    const int64_t dim = c["dim"].get<int64_t>();
    EXPECT_EQ(RowBytes(dim, dtype), c["row_bytes"].get<int64_t>()) << dtype << " dim " << dim;
  }
  for (const json& c : Cases(g, "refused")) {
    const std::string dtype = c["dtype"].get<std::string>();
    const int64_t dim = c["dim"].get<int64_t>();
    int64_t bytes = 0;
    Status st = CheckRowBytes(dim, dtype, &bytes);
    ASSERT_FALSE(st.ok()) << dtype << " dim " << dim;
    EXPECT_EQ(st.message(), c["error"].get<std::string>());
    EXPECT_EQ(RowBytes(dim, dtype), -1);
  }
  // The layout the rows follow: codes of `bits` each, then scale and bias where there are any.
  for (const auto& [dtype, bits] : g["bits"].items()) {
    EXPECT_EQ(RowBytes(8, dtype), bits.get<int64_t>() + g["scale_bias_bytes"][dtype].get<int64_t>())
        << dtype;
  }
}

TEST(Golden, UpdateLogUrls) {
  const json g = Golden("url_golden.json");
  const json& log = g.value("update_log", json::object());
  EXPECT_EQ(log.value("default_stream", ""), kDefaultUpdateStream);
  for (const json& c : Cases(log, "valid")) {
    UpdateUrl u;
    Status st = ParseUpdateUrl(c["url"].get<std::string>(), &u);
    ASSERT_TRUE(st.ok()) << c["url"] << ": " << st.message();
    EXPECT_EQ(u.host, c["host"].get<std::string>()) << c["url"];
    EXPECT_EQ(u.port, c["port"].get<int>()) << c["url"];
    EXPECT_EQ(u.stream, c["stream"].get<std::string>()) << c["url"];
    EXPECT_EQ(u.nodes, (std::vector<std::pair<std::string, int>>{{u.host, u.port}})) << c["url"];
  }
  for (const json& c : Cases(log, "refused")) {
    UpdateUrl u;
    Status st = ParseUpdateUrl(c["url"].get<std::string>(), &u);
    ASSERT_FALSE(st.ok()) << c["url"];
    EXPECT_TRUE(Contains(st, c["error"].get<std::string>())) << st.message();
  }
}

// Node lists (a Redis Cluster's nodes, as the store's URL lists them): host and port are the
// first node's; a bad node is named, a URL of another form refused as a whole.
TEST(Golden, UpdateLogUrlNodeLists) {
  const json g = Golden("stream_url_golden.json");
  EXPECT_EQ(g.value("default_stream", ""), kDefaultUpdateStream);
  for (const json& c : Cases(g, "valid")) {
    UpdateUrl u;
    Status st = ParseUpdateUrl(c["url"].get<std::string>(), &u);
    ASSERT_TRUE(st.ok()) << c["url"] << ": " << st.message();
    EXPECT_EQ(u.nodes, (c["nodes"].get<std::vector<std::pair<std::string, int>>>())) << c["url"];
    EXPECT_EQ(u.host, c["host"].get<std::string>()) << c["url"];
    EXPECT_EQ(u.port, c["port"].get<int>()) << c["url"];
    EXPECT_EQ(u.stream, c["stream"].get<std::string>()) << c["url"];
  }
  for (const json& c : Cases(g, "refused")) {
    UpdateUrl u;
    Status st = ParseUpdateUrl(c["url"].get<std::string>(), &u);
    ASSERT_FALSE(st.ok()) << c["url"];
    EXPECT_TRUE(Contains(st, c["error"].get<std::string>())) << st.message();
  }
}

// The whole-URL refusal and a bad node's, in full as rec/contract/urls.py words them (the golden
// files pin their beginnings).
TEST(Golden, UpdateLogUrlRefusalsInFull) {
  UpdateUrl u;
  EXPECT_EQ(ParseUpdateUrl("redis://h/s", &u).message(),
            "update log URL 'redis://h/s' must look like redis://HOST:PORT[/STREAM] (a cluster: "
            "redis://HOST:PORT,HOST:PORT...[/STREAM])");
  EXPECT_EQ(ParseUpdateUrl("redis://a:1,b/s", &u).message(),
            "update log URL 'redis://a:1,b/s': 'b' is not HOST:PORT; want "
            "redis://HOST:PORT,HOST:PORT...[/STREAM]");
}

TEST(Golden, StoreUrls) {
  const json g = Golden("url_golden.json");
  const json& store = g.value("store", json::object());
  for (const json& c : Cases(store, "valid")) {
    std::vector<std::pair<std::string, int>> nodes;
    Status st = ParseStoreUrl(c["url"].get<std::string>(), &nodes);
    ASSERT_TRUE(st.ok()) << c["url"] << ": " << st.message();
    EXPECT_EQ(nodes, (c["nodes"].get<std::vector<std::pair<std::string, int>>>())) << c["url"];
  }
  for (const json& c : Cases(store, "refused")) {
    std::vector<std::pair<std::string, int>> nodes;
    Status st = ParseStoreUrl(c["url"].get<std::string>(), &nodes);
    ASSERT_FALSE(st.ok()) << c["url"];
    EXPECT_TRUE(Contains(st, c["error"].get<std::string>())) << st.message();
  }
}

// The keys rec-server reads. Not here: `prefix` (rec-server takes it from rec.json) and
// `store_key_refused` (the model makes the keys; the server only splits them, and refuses one
// outside the stored tables in EmbeddingStore::Fetch).
TEST(Golden, StoreKeys) {
  const json g = Golden("store_key_golden.json");
  EXPECT_EQ(g.value("table_shift", 0), kTableShift);
  for (const json& c : Cases(g, "partition_key")) {
    const std::string key =
        PartitionKey(c["prefix"].get<std::string>(), c["table"].get<std::string>(),
                     c["partition"].get<int64_t>());
    EXPECT_EQ(key, c["key"].get<std::string>());
    EXPECT_EQ(KeySlot(key), c["slot"].get<int>()) << key;
  }
  for (const json& c : Cases(g, "meta_key")) {
    const std::string key = MetaKey(c["prefix"].get<std::string>());
    EXPECT_EQ(key, c["key"].get<std::string>());
    EXPECT_EQ(KeySlot(key), c["slot"].get<int>()) << key;
  }
  for (const json& c : Cases(g, "key_slot")) {
    EXPECT_EQ(KeySlot(c["key"].get<std::string>()), c["slot"].get<int>()) << c["key"];
  }
  for (const json& c : Cases(g, "store_key")) {
    const int64_t table = c["table"].get<int64_t>(), row = c["row"].get<int64_t>();
    const int64_t key = c["key"].get<int64_t>();
    EXPECT_EQ(StoreKey(table, row), key);
    EXPECT_EQ(StoreKeyTable(key), table) << key;
    EXPECT_EQ(StoreKeyRow(key), row) << key;
  }
}

// rec.store/2: a ZCH table keyed by raw id. Its ids' partitions and fields, its marker and
// default fields, and the format a section with such a table must name.
TEST(Golden, StoreRawIds) {
  const json g = Golden("store_key_golden.json");
  for (const json& c : Cases(g, "raw_id")) {
    const int64_t id = c["id"].get<int64_t>();
    EXPECT_EQ(RawIdPartition(id, c["partitions"].get<int64_t>()), c["partition"].get<int64_t>())
        << id;
    EXPECT_EQ(std::to_string(id), c["field"].get<std::string>());
  }
  EXPECT_EQ(g["marker_field"].get<std::string>(), kMarkerField);
  EXPECT_EQ(g["default_field"].get<std::string>(), kDefaultField);
  const std::string table =
      R"({"rows": 3, "dim": 4, "dtype": "fp32", "row_bytes": 16, "partitions": 2)";
  for (const auto& [format, keys, ok] :
       {std::tuple{"raw_ids", R"(, "keys": "raw_id"})", true},
        std::tuple{"rows", R"(, "keys": "raw_id"})", false}, std::tuple{"rows", "}", true},
        std::tuple{"raw_ids", "}", false}}) {
    const std::string manifest =
        R"({"store": {"format": ")" + g["formats"][format].get<std::string>() +
        R"(", "url": "redis://h:1", "prefix": "p", "tables": {"t": )" + table + keys + "}}}";
    StoreSpec spec;
    Status st = ParseStoreSection(manifest, "rec.json", &spec);
    EXPECT_EQ(st.ok(), ok) << manifest << ": " << st.message();
    if (ok) {
      EXPECT_EQ(spec.tables[0].raw_id, std::string(keys) != "}");
    }
  }
}

// A store key's table index counts the stored tables in this order, whatever order rec.json
// lists them in.
TEST(Golden, StoreTableOrder) {
  const json g = Golden("store_key_golden.json");
  for (const json& c : Cases(g, "store_order")) {
    // Written out by hand: a json object would sort its keys before the parser saw them.
    std::string tables;
    for (const json& name : c["tables"]) {
      tables += (tables.empty() ? "" : ", ") + json(name).dump() +
                R"(: {"rows": 1, "dim": 4, "dtype": "fp32", "row_bytes": 16, "partitions": 1})";
    }
    const std::string manifest = R"({"store": {"format": "rec.store/1", "url": "redis://h:1", )"
                                 R"("prefix": "p", "tables": {)" +
                                 tables + "}}}";
    StoreSpec spec;
    Status st = ParseStoreSection(manifest, "rec.json", &spec);
    ASSERT_TRUE(st.ok()) << st.message();
    std::vector<std::string> order;
    for (const StoreTable& t : spec.tables) order.push_back(t.name);
    EXPECT_EQ(order, c["order"].get<std::vector<std::string>>());
  }
}

// The config.pbtxt `rec export` writes beside a context model's rec.json (the unbatched form):
// the flat inputs and the model's, each optional.
std::string ContextConfig(const json& manifest) {
  const auto dense = manifest["features"]["dense"].size();
  const auto sparse = manifest["features"]["sparse"].size();
  std::string text = "name: \"c\" platform: \"pytorch_libtorch\" max_batch_size: 0 input [";
  auto input = [&](const std::string& name, const std::string& dtype, const json& shape) {
    text += "{ name: \"" + name + "\" data_type: TYPE_" + dtype + " dims: " + shape.dump() +
            " optional: true },";
  };
  input("dense_features", "FP32", json::array({-1, dense}));
  input("sparse_lengths", "INT32", json::array({-1, sparse}));
  input("sparse_values", "INT64", json::array({-1}));
  for (const json& i : manifest["inputs"]) input(i["name"], i["dtype"], i["shape"]);
  text.pop_back();
  const json& out = manifest["outputs"][0];
  return text + "] output [{ name: \"" + out["name"].get<std::string>() + "\" data_type: TYPE_" +
         out["dtype"].get<std::string>() + " dims: " + out["shape"].dump() + " }]";
}

// A tensor in KServe's JSON form ({datatype, shape, data}) named `name`.
Tensor JsonTensor(const std::string& name, const json& j) {
  Tensor t;
  t.name = name;
  t.dtype = ParseDataType(j["datatype"].get<std::string>());
  t.shape = j["shape"].get<std::vector<int64_t>>();
  for (const json& v : j["data"]) {
    auto put = [&](auto x) { t.data.append(reinterpret_cast<const char*>(&x), sizeof(x)); };
    switch (t.dtype) {
      case DataType::kFp32:
        put(v.get<float>());
        break;
      case DataType::kInt32:
        put(v.get<int32_t>());
        break;
      case DataType::kInt64:
        put(v.get<int64_t>());
        break;
      default:
        AppendBytesElement(v.get<std::string>(), &t.data);
    }
  }
  return t;
}

InferRequest JsonRequest(const json& inputs) {
  InferRequest r;
  for (const auto& [name, t] : inputs.items()) r.inputs.push_back(JsonTensor(name, t));
  return r;
}

TEST(Golden, ContextRequestsBecomeTheModelsInputsOrAreRefusedWithTheirText) {
  const json g = Golden("request_golden.json");
  ASSERT_TRUE(g.contains("manifest"));
  ModelSpec spec;
  ASSERT_TRUE(ParseModelSpec(ContextConfig(g["manifest"]), "c", &spec).ok());
  Status loaded = ApplyManifestText(g["manifest"].dump(), "rec.json", &spec);
  ASSERT_TRUE(loaded.ok()) << loaded.message();
  ASSERT_TRUE(spec.context.present);
  for (const json& c : Cases(g, "valid")) {
    InferRequest r = JsonRequest(c["inputs"]);
    Status st = ValidateRequest(spec, &r);
    ASSERT_TRUE(st.ok()) << c["name"] << ": " << st.message();
    EXPECT_EQ(r.batch_size, c["candidates"].get<int64_t>()) << c["name"];
    const json& want = c["model_inputs"];
    ASSERT_EQ(r.inputs.size(), want.size()) << c["name"];
    for (size_t i = 0; i < r.inputs.size(); ++i) {
      const Tensor expected = JsonTensor(spec.inputs[i].name, want[spec.inputs[i].name]);
      EXPECT_EQ(r.inputs[i].name, expected.name) << c["name"];
      EXPECT_EQ(r.inputs[i].shape, expected.shape) << c["name"] << " " << expected.name;
      EXPECT_EQ(Hex(r.inputs[i].data), Hex(expected.data)) << c["name"] << " " << expected.name;
    }
  }
  for (const json& c : Cases(g, "refused")) {
    InferRequest r = JsonRequest(c["inputs"]);
    Status st = ValidateRequest(spec, &r);
    ASSERT_FALSE(st.ok()) << c["name"];
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << c["name"];
    EXPECT_TRUE(Contains(st, c["error"].get<std::string>()))
        << c["name"] << ": " << st.message() << "\n  want: " << c["error"];
  }
}

}  // namespace
}  // namespace rec
