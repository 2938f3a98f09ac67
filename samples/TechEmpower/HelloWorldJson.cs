using System.Buffers;
using System.Diagnostics.CodeAnalysis;
using System.Text.Json;
using System.Text.Json.Serialization;
using TechEmpower.Scenarios;

namespace TechEmpower;

/// <summary>
/// The JSON test's body, <c>{"message":"Hello, World!"}</c>, serialized afresh on every call (the
/// TechEmpower rules forbid caching it) with the source-generated serializer. Shared by both modes.
/// </summary>
public static class HelloWorldJson
{
    // One buffer and writer per thread: callers copy the bytes out before they next await, so the
    // next call on the same thread may reuse them, and a request allocates nothing but the message.
    [ThreadStatic]
    private static Scratch? t_scratch;

    /// <summary>Serializes a new message.</summary>
    /// <returns>The UTF-8 body, valid until the calling thread's next call.</returns>
    public static ReadOnlySpan<byte> Serialize()
    {
        var scratch = t_scratch ??= new Scratch();
        return scratch.Serialize(new JsonMessage { Message = "Hello, World!" });
    }

    [SuppressMessage("Design", "CA1001:Types that own disposable fields should be disposable",
        Justification = "One per thread for the thread's lifetime; Utf8JsonWriter holds no unmanaged resources.")]
    private sealed class Scratch
    {
        private readonly ArrayBufferWriter<byte> _buffer = new(64);
        private readonly Utf8JsonWriter _writer;

        public Scratch() => _writer = new Utf8JsonWriter(_buffer, new JsonWriterOptions { SkipValidation = true });

        public ReadOnlySpan<byte> Serialize(JsonMessage message)
        {
            _buffer.ResetWrittenCount();
            _writer.Reset(_buffer);
            JsonSerializer.Serialize(_writer, message, TechEmpowerJsonContext.Default.JsonMessage);
            return _buffer.WrittenSpan;
        }
    }
}

/// <summary>The JSON test's object: <c>{"message":"Hello, World!"}</c>.</summary>
public sealed class JsonMessage
{
    /// <summary>The greeting.</summary>
    public required string Message { get; init; }
}

/// <summary>Source-generated System.Text.Json metadata for every type the sample serializes as JSON.</summary>
[JsonSourceGenerationOptions(PropertyNamingPolicy = JsonKnownNamingPolicy.CamelCase)]
[JsonSerializable(typeof(JsonMessage))]
[JsonSerializable(typeof(ScenarioItem))]
public sealed partial class TechEmpowerJsonContext : JsonSerializerContext;
