using System.Text.Json.Serialization;

namespace Soak;

/// <summary>The client's summary JSON, serialized without reflection.</summary>
[JsonSourceGenerationOptions(WriteIndented = true)]
[JsonSerializable(typeof(Dictionary<string, object>))]
[JsonSerializable(typeof(SortedDictionary<string, long>))]
[JsonSerializable(typeof(SortedDictionary<string, SortedDictionary<string, long>>))]
[JsonSerializable(typeof(string[]))]
[JsonSerializable(typeof(long))]
[JsonSerializable(typeof(int))]
[JsonSerializable(typeof(double))]
[JsonSerializable(typeof(bool))]
internal sealed partial class SoakJsonContext : JsonSerializerContext;
