using System.Buffers;
using System.Text.Json;
using System.Text.Json.Serialization;
using Microsoft.AspNetCore.Http;

namespace Kestrel.Transport.Linux.Microbenchmarks.Http;

/// <summary>
/// The two TechEmpower-style handlers as one terminal middleware: no routing, a path compare and a write
/// into the response pipe. Kestrel adds Date and Server; Content-Type and Content-Length are set here, so
/// every response of a kind has the same length (see <see cref="ExpectedResponse"/>).
/// </summary>
internal static class HelloWorldApp
{
    public const string PlaintextPath = "/plaintext";
    public const string JsonPath = "/json";

    public static ReadOnlySpan<byte> PlaintextBody => "Hello, World!"u8;

    // The JSON body is serialized per request, as the TechEmpower rules ask, into a per-thread scratch buffer:
    // its bytes are copied into the response pipe before the handler returns, and Content-Length must be
    // known before the first byte of the body is written.
    [ThreadStatic]
    private static ArrayBufferWriter<byte>? t_jsonBuffer;

    [ThreadStatic]
    private static Utf8JsonWriter? t_jsonWriter;

    public static Task HandleAsync(HttpContext context)
    {
        var response = context.Response;
        switch (context.Request.Path.Value)
        {
            case PlaintextPath:
                Write(response, "text/plain", PlaintextBody);
                break;
            case JsonPath:
                Write(response, "application/json", SerializeGreeting());
                break;
            default:
                response.StatusCode = StatusCodes.Status404NotFound;
                break;
        }

        return Task.CompletedTask;
    }

    private static void Write(HttpResponse response, string contentType, ReadOnlySpan<byte> body)
    {
        // Headers first: the first write into BodyWriter starts the response.
        response.StatusCode = StatusCodes.Status200OK;
        response.ContentType = contentType;
        response.ContentLength = body.Length;
        response.BodyWriter.Write(body);
    }

    private static ReadOnlySpan<byte> SerializeGreeting()
    {
        var buffer = t_jsonBuffer ??= new ArrayBufferWriter<byte>(64);
        buffer.ResetWrittenCount();
        var writer = t_jsonWriter ??= new Utf8JsonWriter(buffer);
        writer.Reset(buffer);
        JsonSerializer.Serialize(writer, new GreetingMessage("Hello, World!"), GreetingJsonContext.Default.GreetingMessage);
        return buffer.WrittenSpan;
    }
}

/// <summary>The JSON test's object, <c>{"message":"Hello, World!"}</c>.</summary>
internal sealed record GreetingMessage(string Message);

[JsonSourceGenerationOptions(PropertyNamingPolicy = JsonKnownNamingPolicy.CamelCase)]
[JsonSerializable(typeof(GreetingMessage))]
internal sealed partial class GreetingJsonContext : JsonSerializerContext;
