using System.Buffers;
using System.Diagnostics.CodeAnalysis;
using System.Text.Json;
using System.Text.Json.Serialization;

namespace TechEmpower;

/// <summary>
/// The TechEmpower plaintext and JSON tests as one terminal middleware: a path match and a direct
/// write to the response pipe, no routing and no MVC. Kestrel adds the Server and Date headers;
/// each response sets Content-Type and Content-Length, and the JSON body is serialized per request.
/// </summary>
public static class TechEmpowerMiddleware
{
    /// <summary>The plaintext test's path.</summary>
    public const string PlaintextPath = "/plaintext";

    /// <summary>The JSON test's path.</summary>
    public const string JsonPath = "/json";

    private const string PlainTextContentType = "text/plain";
    private const string JsonContentType = "application/json";

    private static ReadOnlySpan<byte> HelloWorld => "Hello, World!"u8;

    // One serialization buffer per thread: the bytes are copied into the response pipe before the
    // middleware returns, so the next request on the same thread may reuse them.
    [ThreadStatic]
    private static JsonScratch? t_jsonScratch;

    /// <summary>Serves /plaintext and /json; anything else is 404.</summary>
    /// <param name="context">The request's context.</param>
    /// <returns>A completed task: the body is written to the pipe and Kestrel flushes it at the end of the request.</returns>
    public static Task Invoke(HttpContext context)
    {
        ArgumentNullException.ThrowIfNull(context);

        var path = context.Request.Path.Value;
        if (string.Equals(path, PlaintextPath, StringComparison.Ordinal))
        {
            WritePlaintext(context.Response);
        }
        else if (string.Equals(path, JsonPath, StringComparison.Ordinal))
        {
            WriteJson(context.Response);
        }
        else
        {
            context.Response.StatusCode = StatusCodes.Status404NotFound;
        }

        return Task.CompletedTask;
    }

    private static void WritePlaintext(HttpResponse response)
    {
        var body = HelloWorld;
        response.StatusCode = StatusCodes.Status200OK;
        response.ContentType = PlainTextContentType;
        response.ContentLength = body.Length;
        response.BodyWriter.Write(body);
    }

    private static void WriteJson(HttpResponse response)
    {
        var scratch = t_jsonScratch ??= new JsonScratch();
        var body = scratch.Serialize(new JsonMessage { Message = "Hello, World!" });

        response.StatusCode = StatusCodes.Status200OK;
        response.ContentType = JsonContentType;
        response.ContentLength = body.Length;
        response.BodyWriter.Write(body);
    }

    [SuppressMessage("Design", "CA1001:Types that own disposable fields should be disposable",
        Justification = "One per thread for the thread's lifetime; Utf8JsonWriter holds no unmanaged resources.")]
    private sealed class JsonScratch
    {
        private readonly ArrayBufferWriter<byte> _buffer = new(64);
        private readonly Utf8JsonWriter _writer;

        public JsonScratch() => _writer = new Utf8JsonWriter(_buffer, new JsonWriterOptions { SkipValidation = true });

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

/// <summary>Source-generated System.Text.Json metadata, so serialization needs no reflection (trim and AOT safe).</summary>
[JsonSourceGenerationOptions(PropertyNamingPolicy = JsonKnownNamingPolicy.CamelCase)]
[JsonSerializable(typeof(JsonMessage))]
public sealed partial class TechEmpowerJsonContext : JsonSerializerContext;
