using Microsoft.AspNetCore.Mvc;

namespace TechEmpower.Scenarios;

/// <summary>
/// The application scenarios of the published hosting-model comparisons (text, JSON, XML and an
/// HTML view), served through MVC so each request pays for routing, action selection, formatters
/// and the view engine as a real application does.
/// </summary>
public sealed class ScenariosController : Controller
{
    /// <summary>The /text body: the Latin alphabet and the digits.</summary>
    public const string Alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

    /// <summary>The largest /download body, in KiB.</summary>
    public const int MaxDownloadKib = 16 * 1024;

    /// <summary>
    /// One write of a /download body: byte i of every body is i % 251, and this chunk's length is a
    /// multiple of 251 (261 × 251 = 65,511 bytes, just under 64 KiB), so the chunks join seamlessly.
    /// </summary>
    private static readonly byte[] DownloadChunk = CreateDownloadChunk();

    /// <summary>GET /text: a short plain-text body.</summary>
    /// <returns>The alphabet as text/plain.</returns>
    [HttpGet("/text")]
    public ContentResult Text() => Content(Alphabet, "text/plain");

    /// <summary>GET /json-object: a new <see cref="ScenarioItem"/> serialized by the JSON output formatter.</summary>
    /// <returns>The item, as application/json.</returns>
    [HttpGet("/json-object")]
    [Produces("application/json")]
    public ScenarioItem JsonObject() => ScenarioItem.Create();

    /// <summary>GET /xml: a new <see cref="ScenarioItem"/> serialized by the XmlSerializer output formatter.</summary>
    /// <returns>The item, as application/xml.</returns>
    [HttpGet("/xml")]
    [Produces("application/xml")]
    public ScenarioItem Xml() => ScenarioItem.Create();

    /// <summary>GET /html: the Razor view Views/Scenarios/Html.cshtml rendered from a new model.</summary>
    /// <returns>The rendered page, as text/html.</returns>
    [HttpGet("/html")]
    public ViewResult Html() => View(HtmlPageModel.Create());

    /// <summary>
    /// GET /download/{kib}: a large response, kib KiB of application/octet-stream (byte i is i % 251),
    /// written in chunks of just under 64 KiB, as a file or a generated report would be.
    /// </summary>
    /// <param name="kib">The body's length in KiB, 1 to <see cref="MaxDownloadKib"/>.</param>
    /// <returns>A task that completes when the body is written.</returns>
    [HttpGet("/download/{kib:int:range(1,16384)}")]
    public async Task Download(int kib)
    {
        long length = kib * 1024L;
        Response.ContentType = "application/octet-stream";
        Response.ContentLength = length;
        for (long written = 0; written < length;)
        {
            int count = (int)Math.Min(DownloadChunk.Length, length - written);
            await Response.Body.WriteAsync(DownloadChunk.AsMemory(0, count), HttpContext.RequestAborted);
            written += count;
        }
    }

    private static byte[] CreateDownloadChunk()
    {
        var chunk = new byte[261 * 251];
        for (int i = 0; i < chunk.Length; i++)
        {
            chunk[i] = (byte)(i % 251);
        }

        return chunk;
    }
}
